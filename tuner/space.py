"""The search space of one workload: NSPLIT, HT (divisors of H), TK, BLOCK, STAGES.

NSPLIT's candidates are the fixed list plus, for the device, the grids that fill exactly one or
two waves (sm_count * k // (H / HT)): on 132 SMs a block's tile count is ceil(tiles / NSPLIT),
and the nearest fixed value below a wave (128) costs a whole tile per block over 132. The space
changes with SPACE_VERSION, which is part of the Optuna study name (a study keeps one space)."""

from __future__ import annotations

import itertools

from kernels.config import BLOCK_CHOICES, HT_CHOICES, NSPLIT_CHOICES, STAGES_CHOICES, TK_CHOICES, KernelConfig
from kernels.limits import DeviceLimits
from kernels.validate import MAX_NSPLIT, check

SPACE_VERSION = 2


def nsplit_choices(H: int, limits: DeviceLimits | None = None) -> list[int]:
    """The fixed NSPLIT list, plus the one- and two-wave grids of `limits` for every head tile."""
    extra: set[int] = set()
    if limits is not None:
        for ht in HT_CHOICES:
            if H % ht == 0:
                extra |= {limits.sm_count * k // (H // ht) for k in (1, 2)}
    return sorted(set(NSPLIT_CHOICES) | {n for n in extra if 1 <= n <= MAX_NSPLIT})


def choices(H: int, restrict: dict[str, list[int]] | None = None,
            limits: DeviceLimits | None = None) -> dict[str, list[int]]:
    """Candidate values per constant; `restrict` keeps only the listed values of some of them."""
    full = {
        "NSPLIT": nsplit_choices(H, limits),
        "HT": [h for h in HT_CHOICES if H % h == 0],
        "TK": list(TK_CHOICES),
        "BLOCK": list(BLOCK_CHOICES),
        "STAGES": list(STAGES_CHOICES),
    }
    for name, values in (restrict or {}).items():
        if name not in full:
            raise ValueError(f"unknown constant {name!r}: choose from {', '.join(full)}")
        kept = [v for v in full[name] if v in set(values)]
        if not kept:
            raise ValueError(f"{name}: none of {values} is a candidate ({full[name]})")
        full[name] = kept
    return full


def all_configs(H: int, restrict: dict[str, list[int]] | None = None,
                limits: DeviceLimits | None = None) -> list[KernelConfig]:
    c = choices(H, restrict, limits)
    return [KernelConfig(nsplit=n, ht=h, tk=t, block=b, stages=s)
            for n, h, t, b, s in itertools.product(c["NSPLIT"], c["HT"], c["TK"], c["BLOCK"], c["STAGES"])]


def valid_configs(limits: DeviceLimits, *, H: int, q_len: int,
                  restrict: dict[str, list[int]] | None = None) -> list[KernelConfig]:
    return [cfg for cfg in all_configs(H, restrict, limits) if check(cfg, limits, H=H, q_len=q_len) is None]
