"""The tunable compile-time constants of the verify-attention kernel.

`KernelConfig` is the one home of the constants' names: the kernel's #defines, the database's
`extra` column, the API, exports and the worker client all spell them as `PARAM_NAMES`.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

from verify_tuner.kernels.errors import InvalidConfig

#: Values the search space draws from. HT is further restricted to the divisors of H, QT to
#: the row tiles of q_len, WR/WK to the warp grids the block size allows.
NSPLIT_CHOICES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
HT_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)
TK_CHOICES = (16, 32, 64, 128)
BLOCK_CHOICES = (128, 256, 512, 1024)
STAGES_CHOICES = (2, 3, 4, 6, 8)
WR_CHOICES = (1, 2, 3, 4, 8)
WK_CHOICES = (1, 2, 3, 4, 6)
#: 0, 1: one group of warps, block-wide barriers; 3: the seesaw (two groups of 4 warps take turns at
#: QK + softmax, each applies every P to its half of the latent dims). 2 (two row groups a phase
#: apart) was slower at every measured shape and was removed; its number is not reused.
PIPE_CHOICES = (0, 1, 3)
SF_CHOICES = (0, 1)

#: The constants, in the order tables and exports show them.
PARAM_NAMES = ("NSPLIT", "HT", "TK", "BLOCK", "STAGES", "QT", "WR", "WK", "SF", "PIPE")
#: The four the product was specified with; they are columns of their own in the database.
CORE_PARAMS = ("NSPLIT", "HT", "TK", "BLOCK")


@dataclass(frozen=True, order=True)
class KernelConfig:
    """NSPLIT, HT, TK, BLOCK (the four tuned constants) and the structural choices of kernel v2:
    STAGES cp.async ring slots, QT draft nodes per block (0: all q_len nodes in one block),
    WR x WK the QK warp grid (row groups x k-slices), SF the score fold (1: the k-slices share
    half as many partial-score buffers), PIPE the pipeline (0: PV(t) and QK(t+1) fused, two
    barriers a tile; 1: a slot is refilled right after its PV, three barriers; 3: the seesaw, two
    groups of 4 warps alternate tiles for QK + softmax, named barriers only, 3 slots)."""

    nsplit: int
    ht: int
    tk: int
    block: int
    stages: int = 2
    qt: int = 0
    wr: int = 2
    wk: int = 4
    sf: int = 0
    pipe: int = 1

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            low = 0 if f.name in ("qt", "sf", "pipe") else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                kind = "a non-negative" if low == 0 else "a positive"
                raise InvalidConfig(f"{f.name.upper()} must be {kind} integer, got {value!r}")

    def as_params(self) -> dict[str, int]:
        """Upper-case names, as the kernel's #defines, the API and exports spell them."""
        return {k.upper(): v for k, v in asdict(self).items()}

    def extra_params(self) -> dict[str, int]:
        """The constants beyond the four core ones (stored in the database's `extra` column)."""
        return {k: v for k, v in self.as_params().items() if k not in CORE_PARAMS}

    def row_tile(self, q_len: int) -> int:
        """Draft nodes one block holds: QT, or all of them when QT is 0."""
        return self.qt or q_len

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> KernelConfig:
        """Build from a mapping with upper- or lower-case keys; the four core constants are
        required, the others take their defaults (the compute-mode structure: STAGES=2 QT=0 WR=2
        WK=4 SF=0 PIPE=1)."""
        norm = {str(k).lower(): v for k, v in params.items()}
        missing = {c.lower() for c in CORE_PARAMS} - norm.keys()
        if missing:
            raise InvalidConfig(f"missing constants: {', '.join(sorted(m.upper() for m in missing))}")
        known = {f.name for f in fields(cls)}
        extra = set(norm) - known
        if extra:
            raise InvalidConfig(f"unknown constants: {', '.join(sorted(e.upper() for e in extra))}")
        try:
            values = {k: _integer(v) for k, v in norm.items()}
        except (TypeError, ValueError) as exc:
            raise InvalidConfig(f"constants must be integers: {exc}") from exc
        return cls(**values)

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.as_params().items())


def _integer(v: object) -> int:
    """An integer constant, from an int-like value or its decimal text: true or 132.9 from a
    malformed table must not become NSPLIT=1 or 132."""
    if isinstance(v, bool):
        raise TypeError(f"{v!r} is not an integer")
    if isinstance(v, str):
        return int(v)
    return operator.index(v)  # type: ignore[arg-type]
