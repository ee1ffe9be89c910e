"""The heuristic default config: what the service answers before anything is tuned.

A pure function of (device limits, H, q_len, prefix, batch, KV format). It always returns a config that
passes verify_tuner.kernels.validate for that device, or raises InvalidConfig when none can exist. The default
is the same for every prefix and batch (the kernel shares a batch out over its parts at run time);
tuned rows may differ per prefix and batch bucket.
"""

from __future__ import annotations

from dataclasses import replace

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.formats import DEFAULT as DEFAULT_KV_DTYPE
from verify_tuner.kernels.formats import readable
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.kernels.validate import MAX_Q_LEN, check, registers_needed, smem_bytes
from verify_tuner.space import nsplit_choices, qt_choices

#: Rows per block we aim for: enough to reuse each KV tile, few enough to keep the O^T
#: accumulator in registers (72 rows x 512 dims fp32 = 144 registers at 256 threads).
TARGET_ROWS = 72
#: At most this many rows use the bandwidth templates (tiny Q: shared memory goes to depth).
BANDWIDTH_ROWS = 16
#: (TK, BLOCK, STAGES, WR, WK, SF, PIPE), preferred first, from the structure sweeps on the H200
#: (bench/results/sweep_seesaw_sm_90.md and kernel_sm_90.md): the seesaw (PIPE=3: two groups of 4
#: warps, 2x2 grid per group, 3 slots) wins at every 72-row long-prefix shape, folded scores where
#: unfolded ones do not fit; bandwidth mode (q=1) keeps one group refilling after PV. Where no
#: 32-token tile fits (the 99 KB of sm_120), 4 warps in one row group with 4 k-slices come first:
#: every warp holds all of the block's row tiles (no 2:1:1:1 split of 5 n8 tiles over 4 row
#: groups), which the sm_120 structure check measured fastest (bench/results/sm120_structures_sm_90.json).
#: Where e4m3's halved ring lets 32-token tiles fit there, balanced rows win too: 4 warps, one row
#: group, 2 k-slices ran 0.74x and 0.70x the 2:1:1:1 split that came first before, at H=8 and H=64
#: q=9 (bench/results/sm120_structures_fp8_e4m3_sm_90.json; one sampled structure beat it at H=8
#: only). Above 40 rows it needs more registers than a 4-warp block has, so only the 99-100 KB
#: devices' 33-40-row e4m3 tiles reach it; no other default changed with it.
_COMPUTE = (
    (32, 256, 3, 2, 2, 0, 3),
    (32, 256, 3, 2, 2, 1, 3),
    (32, 256, 2, 2, 4, 0, 1),
    (32, 128, 2, 1, 2, 0, 1),
    (32, 256, 3, 2, 4, 1, 1),
    (32, 256, 3, 2, 2, 0, 1),
    (32, 256, 2, 4, 2, 0, 1),
    (16, 128, 2, 1, 4, 0, 1),
    (16, 256, 3, 2, 4, 0, 1),
    (16, 256, 2, 4, 2, 0, 1),
    (16, 256, 2, 2, 4, 0, 1),
    (16, 128, 2, 2, 2, 0, 1),
)
_BANDWIDTH = (
    (32, 256, 2, 1, 4, 0, 1),
    (32, 256, 3, 1, 4, 0, 1),
    (16, 256, 4, 1, 4, 0, 1),
    (16, 128, 3, 1, 4, 0, 1),
    (16, 128, 2, 1, 4, 0, 1),
)


def _divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def blocks_per_sm(cfg: KernelConfig, q_len: int, limits: DeviceLimits, kv_dtype: str) -> int:
    """Blocks of `cfg` one SM holds at once (shared memory, threads, estimated registers)."""
    by_smem = limits.smem_per_sm // max(1, smem_bytes(cfg, q_len, kv_dtype) + 1024)
    by_threads = 2048 // cfg.block
    by_regs = limits.regs_per_sm // (cfg.block * min(255, registers_needed(cfg, q_len)))
    return max(1, min(by_smem, by_threads, by_regs))


def one_wave_nsplit(
    cfg: KernelConfig,
    limits: DeviceLimits,
    *,
    H: int,
    q_len: int,
    kv_dtype: str = DEFAULT_KV_DTYPE,
) -> int:
    """The largest NSPLIT choice whose grid (head groups x row tiles x parts) fits one wave of `limits`."""
    slots = limits.sm_count * blocks_per_sm(cfg, q_len, limits, kv_dtype)  # blocks in one wave
    groups = (H // cfg.ht) * -(-q_len // (cfg.qt or q_len))
    n = max(1, slots // groups)
    return max(c for c in nsplit_choices(H, limits, q_len) if c <= n)


#: Bandwidth mode's first choice where two blocks of it still share an SM: the seesaw's three
#: slots. e4m3's halved ring allows that on the H200 (H=8 q=1 P=131072: 32.9 us against 37.4 for
#: the two-slot template, bench/results/fp8_configs_sm_90.json); with one block an SM it is slower
#: (bf16: 53.9 against 45.6 us, bench/results/sweep_seesaw_sm_90.md).
_BANDWIDTH_DEEP = (32, 256, 3, 1, 4, 0, 3)


def _templates(rows: int) -> tuple[tuple[int, ...], ...]:
    return _BANDWIDTH if rows <= BANDWIDTH_ROWS else _COMPUTE


def _first_fit(limits: DeviceLimits, *, ht: int, qt: int, H: int, q_len: int, kv_dtype: str) -> KernelConfig | None:
    rows = ht * (qt or q_len)
    deep = (_BANDWIDTH_DEEP,) if rows <= BANDWIDTH_ROWS else ()
    for tk, block, stages, wr, wk, sf, pipe in deep + _templates(rows):
        probe = KernelConfig(nsplit=1, ht=ht, tk=tk, block=block, stages=stages, qt=qt, wr=wr, wk=wk, sf=sf, pipe=pipe)
        if check(probe, limits, H=H, q_len=q_len, kv_dtype=kv_dtype) is not None:
            continue
        template = (tk, block, stages, wr, wk, sf, pipe)
        if deep and template == _BANDWIDTH_DEEP and blocks_per_sm(probe, q_len, limits, kv_dtype) < 2:
            continue
        return probe
    return None


def _row_tiles(H: int, q_len: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(HT, QT) to try, largest first: head tiles holding all nodes with at most TARGET_ROWS
    rows (at least one full n8 tile where H allows it), then row tiles of one head; and, for when
    none of those fits the device, the smaller head tiles they left out (H=41 q_len=1 on a 99 KB
    device: its 41-row tile fits no template, one head a block does)."""
    fits = [d for d in _divisors_desc(H) if d * q_len <= TARGET_ROWS]
    full = [d for d in fits if d * q_len >= 8]
    first = full or fits[:1]
    out = [(d, 0) for d in first] + [(1, qt) for qt in sorted(qt_choices(q_len)[1:], reverse=True)]
    return out, [(d, 0) for d in fits if d not in first]


def heuristic_config(
    limits: DeviceLimits, *, H: int, q_len: int, prefix: int, batch: int = 1, kv_dtype: str = DEFAULT_KV_DTYPE
) -> KernelConfig:
    """The largest row tile whose grid (head groups x row tiles x NSPLIT parts) fills at least half
    a wave, with NSPLIT the largest choice within one wave; when no row tile fills half a wave, the
    one with the most blocks. The default depends on neither the prefix nor the batch (they are
    only checked): the kernel shares the batch's tiles out over the parts at run time and leaves
    parts idle when there are fewer tiles than parts, so one config, captured once in a graph,
    serves every prefix; and the seesaw measured on par with the two-barrier pipeline even at 4k
    prefixes (bench/results/runtime_sm_90.md)."""
    if H < 1 or not 1 <= q_len <= MAX_Q_LEN or prefix < 0 or batch < 1:
        raise InvalidConfig(f"no config for H={H}, q_len={q_len}, prefix={prefix}, batch={batch}")
    readable(kv_dtype, limits.cc_major * 10 + limits.cc_minor)  # the format's own reason, not "no config fits"
    preferred, smaller = _row_tiles(H, q_len)
    cfg = _pick(limits, preferred, H=H, q_len=q_len, kv_dtype=kv_dtype) or _pick(
        limits, smaller, H=H, q_len=q_len, kv_dtype=kv_dtype
    )
    if cfg is None:
        raise InvalidConfig(f"no kernel config fits {limits.name} for H={H}, q_len={q_len}")
    return cfg


def _pick(
    limits: DeviceLimits, tiles: list[tuple[int, int]], *, H: int, q_len: int, kv_dtype: str
) -> KernelConfig | None:
    """The first of `tiles` whose grid fills half a wave, else the fitting one with the most blocks."""
    fallback: tuple[int, KernelConfig] | None = None
    for ht, qt in tiles:
        probe = _first_fit(limits, ht=ht, qt=qt, H=H, q_len=q_len, kv_dtype=kv_dtype)
        if probe is None:
            continue
        slots = limits.sm_count * blocks_per_sm(probe, q_len, limits, kv_dtype)  # blocks in one wave
        cfg = replace(probe, nsplit=one_wave_nsplit(probe, limits, H=H, q_len=q_len, kv_dtype=kv_dtype))
        blocks = (H // ht) * -(-q_len // (qt or q_len)) * cfg.nsplit
        if 2 * blocks >= slots:
            return cfg
        if fallback is None or blocks > fallback[0]:
            fallback = (blocks, cfg)
    return fallback[1] if fallback else None
