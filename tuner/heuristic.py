"""The heuristic default config: what the service answers before anything is tuned.

A pure function of (device limits, H, q_len, prefix). It always returns a config that passes
kernels.validate for that device, or raises InvalidConfig when none can exist.
"""

from __future__ import annotations

from kernels.config import NSPLIT_CHOICES, KernelConfig
from kernels.errors import InvalidConfig
from kernels.limits import DeviceLimits
from kernels.validate import check, smem_bytes

#: Rows per block we aim for: enough to reuse each KV tile, few enough to keep the accumulator
#: in registers.
TARGET_ROWS = 80
WAVES = 2
MIN_TILES_PER_SPLIT = 4
_TILE_PREFS = ((64, 2), (32, 2), (32, 3), (16, 2), (16, 3))
_BLOCK_PREFS = (256, 512, 128, 1024)


def _divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def _blocks_per_sm(cfg: KernelConfig, q_len: int, limits: DeviceLimits) -> int:
    by_smem = limits.smem_per_sm // max(1, smem_bytes(cfg, q_len) + 1024)
    by_threads = 2048 // cfg.block
    return max(1, min(by_smem, by_threads))


def _nsplit(*, ht: int, tk: int, H: int, q_len: int, prefix: int, per_sm: int, limits: DeviceLimits) -> int:
    groups = H // ht
    want = -(-WAVES * limits.sm_count * per_sm // groups)
    cap = max(1, (prefix + q_len) // (MIN_TILES_PER_SPLIT * tk))
    n = max(1, min(want, cap))
    return max(c for c in NSPLIT_CHOICES if c <= n)


def heuristic_config(limits: DeviceLimits, *, H: int, q_len: int, prefix: int) -> KernelConfig:
    """Largest head tile within TARGET_ROWS that fits, a tile that fits, NSPLIT by the wave rule."""
    if H < 1 or not 1 <= q_len <= 64 or prefix < 0:
        raise InvalidConfig(f"no config for H={H}, q_len={q_len}, prefix={prefix}")
    hts = [d for d in _divisors_desc(H) if d * q_len <= TARGET_ROWS] or [1]
    for ht in hts:
        for tk, stages in _TILE_PREFS:
            for block in _BLOCK_PREFS:
                probe = KernelConfig(nsplit=1, ht=ht, tk=tk, block=block, stages=stages)
                if check(probe, limits, H=H, q_len=q_len) is not None:
                    continue
                per_sm = _blocks_per_sm(probe, q_len, limits)
                ns = _nsplit(ht=ht, tk=tk, H=H, q_len=q_len, prefix=prefix, per_sm=per_sm, limits=limits)
                return KernelConfig(nsplit=ns, ht=ht, tk=tk, block=block, stages=stages)
    raise InvalidConfig(f"no kernel config fits {limits.name} for H={H}, q_len={q_len}")
