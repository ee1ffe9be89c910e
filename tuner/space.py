"""The search space of one workload: the four core constants and kernel v2's structural choices.

NSPLIT's candidates are the fixed list plus, for the device, the grids that fill one or two waves
as nearly as whole parts a row group allow (sm_count * k // G, G = H/HT head groups times the row
tiles of q_len). QT's are 0 (all nodes in one block) and the even row tiles
of q_len. The space changes with SPACE_VERSION, which is part of the Optuna study name (a study
keeps one space).

Validity does not depend on NSPLIT (beyond its range), so `valid_configs` checks each
structure once and multiplies: the full product has millions of points, the valid set thousands."""

from __future__ import annotations

import functools
import itertools
from dataclasses import replace

from verify_tuner.kernels.config import (
    BLOCK_CHOICES,
    HT_CHOICES,
    NSPLIT_CHOICES,
    PARAM_NAMES,
    PIPE_CHOICES,
    SF_CHOICES,
    STAGES_CHOICES,
    TK_CHOICES,
    WK_CHOICES,
    WR_CHOICES,
    KernelConfig,
)
from verify_tuner.kernels.formats import DEFAULT as DEFAULT_KV_DTYPE
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.kernels.validate import MAX_NSPLIT, check

#: 5: PIPE=2 left the space again (slower at every measured shape); swizzled smem rows.
#: 6: PIPE=3, the seesaw (two warp groups alternate tiles).
#: 7: the search proposes QT's row tiles (space 3 to 6 enumerated them as valid but searched QT=0 only).
#: 8: kernel v3: NSPLIT is the parts a head group's grid has, shared out over the batch at run time.
#: 9: the one- and two-wave NSPLIT of row-tiled grids (G counts row tiles too, not head groups only).
SPACE_VERSION = 9


def nsplit_choices(H: int, limits: DeviceLimits | None = None, q_len: int | None = None) -> list[int]:
    """The fixed NSPLIT list, plus the one- and two-wave grids of `limits` for every row-group count
    G a config of (H, q_len) can have: its head tiles times q_len's row tiles (the grid does not grow
    with the batch: its parts share the batch out). A grid of G x NSPLIT fills a wave only as far as
    whole parts a group allow, and only if sm_count // G is a choice (16 row groups on 188 SMs: 11)."""
    extra: set[int] = set()
    if limits is not None:
        row_tiles = {-(-q_len // (qt or q_len)) for qt in qt_choices(q_len)} if q_len is not None else {1}
        for ht in HT_CHOICES:
            if H % ht == 0:
                for nqt in row_tiles:
                    extra |= {limits.sm_count * k // (H // ht * nqt) for k in (1, 2)}
    return sorted(set(NSPLIT_CHOICES) | {n for n in extra if 1 <= n <= MAX_NSPLIT})


def qt_choices(q_len: int | None) -> list[int]:
    """0 (one block holds all nodes) and the row tiles that split q_len into 2..8 even parts."""
    if q_len is None:
        return [0]
    return [0] + sorted({-(-q_len // k) for k in range(2, 9)} - {q_len})


def choices(
    H: int,
    restrict: dict[str, list[int]] | None = None,
    limits: DeviceLimits | None = None,
    q_len: int | None = None,
) -> dict[str, list[int]]:
    """Candidate values per constant; `restrict` keeps only the listed values of some of them."""
    full = {
        "NSPLIT": nsplit_choices(H, limits, q_len),
        "HT": [h for h in HT_CHOICES if H % h == 0],
        "TK": list(TK_CHOICES),
        "BLOCK": list(BLOCK_CHOICES),
        "STAGES": list(STAGES_CHOICES),
        "QT": qt_choices(q_len),
        "WR": list(WR_CHOICES),
        "WK": list(WK_CHOICES),
        "SF": list(SF_CHOICES),
        "PIPE": list(PIPE_CHOICES),
    }
    assert tuple(full) == PARAM_NAMES
    for name, values in (restrict or {}).items():
        if name not in full:
            raise ValueError(f"unknown constant {name!r}: choose from {', '.join(full)}")
        kept = [v for v in full[name] if v in set(values)]
        if not kept:
            raise ValueError(f"{name}: none of {values} is a candidate ({full[name]})")
        full[name] = kept
    return full


def valid_configs(
    limits: DeviceLimits,
    *,
    H: int,
    q_len: int,
    restrict: dict[str, list[int]] | None = None,
    kv_dtype: str = DEFAULT_KV_DTYPE,
) -> list[KernelConfig]:
    """Every config of the space that passes verify_tuner.kernels.validate for (limits, H, q_len) on a
    `kv_dtype` cache. Cached: every key of a table shares one, and enumerating takes ~0.5 s."""
    frozen = tuple(sorted((k, tuple(v)) for k, v in (restrict or {}).items()))
    # the measured copy bandwidth, which a measurer adds after its start, does not change validity
    return list(_valid_configs(replace(limits, copy_bw_gbps=None), H, q_len, frozen, kv_dtype))


@functools.lru_cache(maxsize=64)
def _valid_configs(
    limits: DeviceLimits,
    H: int,
    q_len: int,
    restrict: tuple[tuple[str, tuple[int, ...]], ...],
    kv_dtype: str,
) -> tuple[KernelConfig, ...]:
    c = choices(H, {k: list(v) for k, v in restrict}, limits, q_len)
    structural = [name for name in PARAM_NAMES if name != "NSPLIT"]
    structures = []
    for values in itertools.product(*(c[n] for n in structural)):
        probe = KernelConfig(nsplit=1, **{n.lower(): v for n, v in zip(structural, values)})
        if check(probe, limits, H=H, q_len=q_len, kv_dtype=kv_dtype) is None:
            structures.append(probe)
    return tuple(replace(s, nsplit=n) for s in structures for n in c["NSPLIT"])
