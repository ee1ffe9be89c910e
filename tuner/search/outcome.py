"""What tuning one key decided: its study, the best config and the default with their
measurements, whether the best was stored, and why. The winner phase decides
(verify_tuner.search.winner.Winner); the study returns the whole (verify_tuner.search.study)."""

from __future__ import annotations

from dataclasses import dataclass, field

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.keys import ConfigKey
from verify_tuner.measure.backend import Measurement, Workload
from verify_tuner.search.winner import Winner


@dataclass(frozen=True)
class Outcome:
    key: ConfigKey
    workload: Workload
    study_id: int
    best: KernelConfig | None = None
    best_m: Measurement | None = None
    default: KernelConfig | None = None
    default_m: Measurement | None = None
    stored: bool = False
    decision: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    @classmethod
    def of(
        cls,
        key: ConfigKey,
        workload: Workload,
        study_id: int,
        default: KernelConfig | None,
        winner: Winner,
        counts: dict[str, int],
        wall_s: float,
    ) -> Outcome:
        return cls(
            key=key,
            workload=workload,
            study_id=study_id,
            best=winner.best,
            best_m=winner.best_m,
            default=default,
            default_m=winner.default_m,
            stored=winner.stored,
            decision=winner.reason,
            counts=counts,
            wall_s=wall_s,
        )

    @property
    def speedup(self) -> float | None:
        if self.best_m and self.default_m and self.best_m.median_us and self.default_m.median_us:
            return self.default_m.median_us / self.best_m.median_us
        return None
