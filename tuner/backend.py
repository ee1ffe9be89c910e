"""The interface between the tuner's logic and whatever measures a config.

The tuner only talks to `Backend`; the product backend (tuner.worker.IsolatedBackend) measures
on the local GPU in a separate process. Tests drive the same logic with a fake backend that
lives under tests/ only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from kernels.config import KernelConfig
from kernels.limits import DeviceLimits

#: Trial states, as stored in trials.state
OK, INVALID, COMPILE_ERROR, WRONG, CRASHED, TIMEOUT = "ok", "invalid", "compile_error", "wrong", "crashed", "timeout"


@dataclass(frozen=True)
class Workload:
    H: int
    q_len: int
    prefix: int
    dtype: str = "bf16"

    def floor_bytes(self) -> int:
        """Bytes that must move once: KV of prefix + draft, q in, o out."""
        return (self.prefix + self.q_len) * 576 * 2 + self.q_len * self.H * (576 + 512) * 2


@dataclass(frozen=True)
class Measurement:
    state: str
    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    samples: list[float] = field(default_factory=list)
    rel_error: float | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.state == OK


class Backend(Protocol):
    limits: DeviceLimits

    def measure(self, cfg: KernelConfig, workload: Workload) -> Measurement:
        """Compile (cached), check against the fp32 reference, then time `cfg` on `workload`."""
        ...

    def remeasure(self, cfgs: list[KernelConfig], workload: Workload, rounds: int) -> list[Measurement]:
        """Time already-checked configs interleaved (A/B/A/B...) so drift hits all alike."""
        ...

    def close(self) -> None: ...
