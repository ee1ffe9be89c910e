"""The heuristic default config: what the service answers before anything is tuned.

A pure function of (device limits, H, q_len, prefix). It always returns a config that passes
kernels.validate for that device, or raises InvalidConfig when none can exist.
"""

from __future__ import annotations

from dataclasses import replace

from kernels.config import KernelConfig
from kernels.errors import InvalidConfig
from kernels.limits import DeviceLimits
from kernels.validate import check, smem_bytes
from tuner.space import nsplit_choices

#: Rows per block we aim for: enough to reuse each KV tile, few enough to keep the accumulator
#: in registers.
TARGET_ROWS = 80
#: A split keeps at least this many KV tiles (a shorter one is mostly prologue and epilogue).
MIN_TILES_PER_SPLIT = 2
_TILE_PREFS = ((64, 2), (32, 2), (32, 3), (16, 2), (16, 3))
_BLOCK_PREFS = (256, 512, 128, 1024)
# Measured on the H200 (bench/results/kernel_sm_90.json, sweep_H8_q9_p46000_sm_90.json): the
# fastest grid is the largest that runs in ONE wave (e.g. H=8 q=9 P=46k: 128 blocks 76 us, 96
# blocks 88 us, 256 blocks 92 us), and on short prefixes a smaller head tile that fills the wave
# beats a large one that cannot (H=8 q=9 P=1k: HT=1 17 us vs HT=8 36 us).


def _divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def _blocks_per_sm(cfg: KernelConfig, q_len: int, limits: DeviceLimits) -> int:
    by_smem = limits.smem_per_sm // max(1, smem_bytes(cfg, q_len) + 1024)
    by_threads = 2048 // cfg.block
    return max(1, min(by_smem, by_threads))


def _first_fit(limits: DeviceLimits, *, ht: int, H: int, q_len: int) -> KernelConfig | None:
    for tk, stages in _TILE_PREFS:
        for block in _BLOCK_PREFS:
            probe = KernelConfig(nsplit=1, ht=ht, tk=tk, block=block, stages=stages)
            if check(probe, limits, H=H, q_len=q_len) is None:
                return probe
    return None


def _head_tiles(H: int, q_len: int) -> list[int]:
    """Head tiles to try, largest first: at most TARGET_ROWS rows, and at least one full n8
    tile of rows (8) where H allows it."""
    fits = [d for d in _divisors_desc(H) if d * q_len <= TARGET_ROWS] or [1]
    full = [d for d in fits if d * q_len >= 8]
    return full or fits[:1]


def heuristic_config(limits: DeviceLimits, *, H: int, q_len: int, prefix: int) -> KernelConfig:
    """The largest head tile whose grid fills at least half a wave, with NSPLIT the largest
    choice that keeps the grid within one wave and each split at least MIN_TILES_PER_SPLIT
    tiles long; when no head tile fills half a wave, the one with the most blocks."""
    if H < 1 or not 1 <= q_len <= 64 or prefix < 0:
        raise InvalidConfig(f"no config for H={H}, q_len={q_len}, prefix={prefix}")
    fallback: tuple[int, KernelConfig] | None = None
    for ht in _head_tiles(H, q_len):
        probe = _first_fit(limits, ht=ht, H=H, q_len=q_len)
        if probe is None:
            continue
        slots = limits.sm_count * _blocks_per_sm(probe, q_len, limits)  # blocks in one wave
        groups = H // ht
        cap = max(1, (prefix + q_len) // (MIN_TILES_PER_SPLIT * probe.tk))
        # The one-wave grid is itself a search choice (tuner.space): a block's time is its tile
        # count, ceil(tiles / NSPLIT), and the most blocks that fit one wave minimise it for every
        # prefix length in the bucket (H=8 q=9 P=46k on 132 SMs: 11 tiles at 132, 12 at 128).
        n = max(1, min(slots // groups, cap))
        cfg = replace(probe, nsplit=max(c for c in nsplit_choices(H, limits) if c <= n))
        blocks = groups * cfg.nsplit
        if 2 * blocks >= slots:
            return cfg
        if fallback is None or blocks > fallback[0]:
            fallback = (blocks, cfg)
    if fallback is None:
        raise InvalidConfig(f"no kernel config fits {limits.name} for H={H}, q_len={q_len}")
    return fallback[1]
