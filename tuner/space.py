"""The search space of one workload: NSPLIT, HT (divisors of H), TK, BLOCK, STAGES."""

from __future__ import annotations

import itertools

from kernels.config import BLOCK_CHOICES, HT_CHOICES, NSPLIT_CHOICES, STAGES_CHOICES, TK_CHOICES, KernelConfig
from kernels.limits import DeviceLimits
from kernels.validate import check


def choices(H: int) -> dict[str, list[int]]:
    return {
        "NSPLIT": list(NSPLIT_CHOICES),
        "HT": [h for h in HT_CHOICES if H % h == 0],
        "TK": list(TK_CHOICES),
        "BLOCK": list(BLOCK_CHOICES),
        "STAGES": list(STAGES_CHOICES),
    }


def all_configs(H: int) -> list[KernelConfig]:
    c = choices(H)
    return [KernelConfig(nsplit=n, ht=h, tk=t, block=b, stages=s)
            for n, h, t, b, s in itertools.product(c["NSPLIT"], c["HT"], c["TK"], c["BLOCK"], c["STAGES"])]


def valid_configs(limits: DeviceLimits, *, H: int, q_len: int) -> list[KernelConfig]:
    return [cfg for cfg in all_configs(H) if check(cfg, limits, H=H, q_len=q_len) is None]
