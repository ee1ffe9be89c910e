"""What tuning one key decided: its study, the best config and the default with their
measurements, whether the best was stored, and why. The search fills it in (verify_tuner.search.trials),
the winner phase completes it (verify_tuner.search.winner), the study returns it (verify_tuner.search.study).

Its own module because all three need it: it lived in verify_tuner.search.study, which imports the other
two, so they could only name it under TYPE_CHECKING (an import cycle held off by a flag)."""

from __future__ import annotations

from dataclasses import dataclass, field

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.keys import ConfigKey
from verify_tuner.measure.backend import Measurement, Workload


@dataclass
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

    @property
    def speedup(self) -> float | None:
        if self.best_m and self.default_m and self.best_m.median_us and self.default_m.median_us:
            return self.default_m.median_us / self.best_m.median_us
        return None
