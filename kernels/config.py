"""The tunable compile-time constants of the verify-attention kernel."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from kernels.errors import InvalidConfig

#: Values the search space draws from. HT is further restricted to the divisors of H.
NSPLIT_CHOICES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
HT_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)
TK_CHOICES = (16, 32, 64, 128)
BLOCK_CHOICES = (128, 256, 512, 1024)
STAGES_CHOICES = (2, 3)


@dataclass(frozen=True, order=True)
class KernelConfig:
    """NSPLIT, HT, TK, BLOCK (the four tuned constants) plus the cp.async pipeline depth."""

    nsplit: int
    ht: int
    tk: int
    block: int
    stages: int = 2

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidConfig(f"{f.name.upper()} must be a positive integer, got {value!r}")

    def as_params(self) -> dict[str, int]:
        """Upper-case names, as the kernel's #defines, the API and exports spell them."""
        return {k.upper(): v for k, v in asdict(self).items()}

    @classmethod
    def from_params(cls, params: dict[str, object]) -> KernelConfig:
        """Build from a mapping with upper- or lower-case keys; STAGES is optional."""
        norm = {str(k).lower(): v for k, v in params.items()}
        missing = {"nsplit", "ht", "tk", "block"} - norm.keys()
        if missing:
            raise InvalidConfig(f"missing constants: {', '.join(sorted(m.upper() for m in missing))}")
        known = {f.name for f in fields(cls)}
        extra = set(norm) - known
        if extra:
            raise InvalidConfig(f"unknown constants: {', '.join(sorted(e.upper() for e in extra))}")
        try:
            values = {k: int(v) for k, v in norm.items()}  # type: ignore[call-overload]
        except (TypeError, ValueError) as exc:
            raise InvalidConfig(f"constants must be integers: {exc}") from exc
        return cls(**values)

    def __str__(self) -> str:
        return f"NSPLIT={self.nsplit} HT={self.ht} TK={self.tk} BLOCK={self.block} STAGES={self.stages}"
