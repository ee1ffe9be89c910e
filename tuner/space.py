"""The search space of one workload: NSPLIT, HT (divisors of H), TK, BLOCK, STAGES."""

from __future__ import annotations

import itertools

from kernels.config import BLOCK_CHOICES, HT_CHOICES, NSPLIT_CHOICES, STAGES_CHOICES, TK_CHOICES, KernelConfig
from kernels.limits import DeviceLimits
from kernels.validate import check


def choices(H: int, restrict: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
    """Candidate values per constant; `restrict` keeps only the listed values of some of them."""
    full = {
        "NSPLIT": list(NSPLIT_CHOICES),
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


def all_configs(H: int, restrict: dict[str, list[int]] | None = None) -> list[KernelConfig]:
    c = choices(H, restrict)
    return [KernelConfig(nsplit=n, ht=h, tk=t, block=b, stages=s)
            for n, h, t, b, s in itertools.product(c["NSPLIT"], c["HT"], c["TK"], c["BLOCK"], c["STAGES"])]


def valid_configs(limits: DeviceLimits, *, H: int, q_len: int,
                  restrict: dict[str, list[int]] | None = None) -> list[KernelConfig]:
    return [cfg for cfg in all_configs(H, restrict) if check(cfg, limits, H=H, q_len=q_len) is None]
