"""The heuristic default config: what the service answers before anything is tuned.

A pure function of (device limits, H, q_len, prefix, batch). It always returns a config that
passes verify_tuner.kernels.validate for that device, or raises InvalidConfig when none can exist. `prefix`
is the batch's lookup prefix (verify_tuner.batches.prefix_of: its longest request), so a split is sized
for the request that finishes last.
"""

from __future__ import annotations

from dataclasses import replace

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.kernels.validate import MAX_Q_LEN, check, registers_needed, smem_bytes
from verify_tuner.space import nsplit_choices, qt_choices

#: Rows per block we aim for: enough to reuse each KV tile, few enough to keep the O^T
#: accumulator in registers (72 rows x 512 dims fp32 = 144 registers at 256 threads).
TARGET_ROWS = 72
#: At most this many rows use the bandwidth templates (tiny Q: shared memory goes to depth).
BANDWIDTH_ROWS = 16
#: A split keeps at least this many KV tiles (a shorter one is mostly prologue and epilogue).
MIN_TILES_PER_SPLIT = 2
#: Ragged batches (B > 1) get a two-wave grid when each split still walks this many tiles: the
#: blocks of shorter requests finish early and the second wave fills their SMs. Measured on the
#: H200 at H=8 q=9 (bench/results/batch_sm_90.md): two waves win at B=8 and B=32 with 46k-70k
#: prefixes (43-180 tiles a split; 1.13-1.21x), one wave wins at 4096 (4-16 tiles a split).
TWO_WAVE_TILES = 32
#: (TK, BLOCK, STAGES, WR, WK, SF, PIPE), preferred first. Measured on the H200 (bench/results/
#: sweep_*_sm_90.md, 2026-11-29): at 72 rows the 2 row groups x 4 k-slices grid with 2 slots wins
#: (56.5 us at H=8 q=9 P=46k; 60.8 for 2x2 with 3 slots, 61.4 for a third slot through folded
#: scores, 67-75 for 16-token tiles); refilling slots right after PV (PIPE=1) wins at every long
#: prefix (H=64: 334 vs 347 us); small row tiles at two blocks per SM lose (74 us). Bandwidth
#: mode: two blocks per SM. Session 6 (bench/results/sweep_seesaw_sm_90.md, 2026-11-30): the
#: seesaw (PIPE=3, two groups of 4 warps, 2x2 grid per group, folded scores, 3 slots) beats the
#: 2x4 PIPE=1 grid at every 46k-prefix shape: H=8 40.5 vs 43.8 us, H=16 64.5 vs 76.3, H=64 219.7
#: vs 266.8, H=128 427.1 vs 520.4, H=32 P=16k 50.3 vs 59.2; it loses in bandwidth mode (q=1: 53.9
#: vs 45.6). Where a score buffer per k-slice fits (32-36 rows) the unfolded one is faster (H=8 q=4
#: 27.3 vs 28.7 folded vs 29.6 PIPE=1; sweep_seesaw_mid_sm_90.md); at 72 rows only the folded fits.
_COMPUTE = (
    (32, 256, 3, 2, 2, 0, 3),
    (32, 256, 3, 2, 2, 1, 3),
    (32, 256, 2, 2, 4, 0, 1),
    (32, 256, 3, 2, 4, 1, 1),
    (32, 256, 3, 2, 2, 0, 1),
    (32, 256, 2, 4, 2, 0, 1),
    (16, 256, 3, 2, 4, 0, 1),
    (16, 256, 2, 4, 2, 0, 1),
    (16, 256, 2, 2, 4, 0, 1),
    (16, 128, 2, 1, 4, 0, 1),
    (16, 128, 2, 2, 2, 0, 1),
)
#: Splits of at most SHORT_TILES tiles (short prefixes): one barrier fewer per tile and a third
#: slot beat refilling after PV (H=8 q=9 P=4096: 16.2 us vs 19.0, bench/results/sweep_*_sm_90.md).
SHORT_TILES = 4
_SHORT = ((32, 256, 3, 2, 2, 0, 0), (32, 256, 3, 2, 4, 1, 0))
_BANDWIDTH = (
    (32, 256, 2, 1, 4, 0, 1),
    (32, 256, 3, 1, 4, 0, 1),
    (16, 256, 4, 1, 4, 0, 1),
    (16, 128, 3, 1, 4, 0, 1),
    (16, 128, 2, 1, 4, 0, 1),
)


def _divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def _blocks_per_sm(cfg: KernelConfig, q_len: int, limits: DeviceLimits) -> int:
    by_smem = limits.smem_per_sm // max(1, smem_bytes(cfg, q_len) + 1024)
    by_threads = 2048 // cfg.block
    by_regs = limits.regs_per_sm // (cfg.block * min(255, registers_needed(cfg, q_len)))
    return max(1, min(by_smem, by_threads, by_regs))


def _templates(rows: int, tokens_per_group: int) -> tuple[tuple[int, ...], ...]:
    if rows <= BANDWIDTH_ROWS:
        return _BANDWIDTH
    return _SHORT + _COMPUTE if tokens_per_group <= SHORT_TILES * 32 else _COMPUTE


def _first_fit(
    limits: DeviceLimits, *, ht: int, qt: int, H: int, q_len: int, prefix: int, batch: int
) -> KernelConfig | None:
    rows = ht * (qt or q_len)
    groups = batch * (H // ht) * -(-q_len // (qt or q_len))
    tokens_per_group = (prefix + q_len) * groups // limits.sm_count  # tokens a one-wave block walks
    for tk, block, stages, wr, wk, sf, pipe in _templates(rows, tokens_per_group):
        probe = KernelConfig(nsplit=1, ht=ht, tk=tk, block=block, stages=stages, qt=qt, wr=wr, wk=wk, sf=sf, pipe=pipe)
        if check(probe, limits, H=H, q_len=q_len) is None:
            return probe
    return None


def _row_tiles(H: int, q_len: int) -> list[tuple[int, int]]:
    """(HT, QT) to try, largest first: head tiles holding all nodes with at most TARGET_ROWS
    rows (at least one full n8 tile where H allows it), then row tiles of one head."""
    fits = [d for d in _divisors_desc(H) if d * q_len <= TARGET_ROWS]
    full = [d for d in fits if d * q_len >= 8]
    out = [(d, 0) for d in (full or fits[:1])]
    return out + [(1, qt) for qt in sorted(qt_choices(q_len)[1:], reverse=True)]  # row tiles of one head


def heuristic_config(limits: DeviceLimits, *, H: int, q_len: int, prefix: int, batch: int = 1) -> KernelConfig:
    """The largest row tile whose grid (batch x head groups x row tiles x NSPLIT blocks) fills
    at least half a wave, with NSPLIT the largest choice that keeps the grid within one wave
    and each split at least MIN_TILES_PER_SPLIT tiles long; when no row tile fills half a wave,
    the one with the most blocks. More requests per launch mean fewer splits each, hence also
    fewer partial bytes (batch x rows x NSPLIT x 1 KB) for the reduce."""
    if H < 1 or not 1 <= q_len <= MAX_Q_LEN or prefix < 0 or batch < 1:
        raise InvalidConfig(f"no config for H={H}, q_len={q_len}, prefix={prefix}, batch={batch}")
    fallback: tuple[int, KernelConfig] | None = None
    for ht, qt in _row_tiles(H, q_len):
        probe = _first_fit(limits, ht=ht, qt=qt, H=H, q_len=q_len, prefix=prefix, batch=batch)
        if probe is None:
            continue
        slots = limits.sm_count * _blocks_per_sm(probe, q_len, limits)  # blocks in one wave
        groups = batch * (H // ht) * -(-q_len // (qt or q_len))
        cap = max(1, (prefix + q_len) // (MIN_TILES_PER_SPLIT * probe.tk))
        n = max(1, min(slots // groups, cap))
        if batch > 1 and (prefix + q_len) // max(1, 2 * slots // groups) >= TWO_WAVE_TILES * probe.tk:
            n = max(1, min(2 * slots // groups, cap))
        cfg = replace(probe, nsplit=max(c for c in nsplit_choices(H, limits, batch) if c <= n))
        blocks = groups * cfg.nsplit
        if 2 * blocks >= slots:
            return cfg
        if fallback is None or blocks > fallback[0]:
            fallback = (blocks, cfg)
    if fallback is None:
        raise InvalidConfig(f"no kernel config fits {limits.name} for H={H}, q_len={q_len}")
    return fallback[1]
