"""The interface between the tuner's logic and whatever measures a config.

The tuner only talks to `Backend`; the product backend (verify_tuner.measure.gpu_backend.IsolatedBackend) measures
on the local GPU in a separate process. Tests drive the same logic with a fake backend that
lives under tests/ only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.formats import DEFAULT as DEFAULT_KV_DTYPE
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.keys import check_kv_dtype

#: Trial states, as stored in trials.state
OK, INVALID, COMPILE_ERROR, WRONG, CRASHED, TIMEOUT = "ok", "invalid", "compile_error", "wrong", "crashed", "timeout"


@dataclass(frozen=True)
class Workload:
    """What one study measures: `batch` requests whose prefixes are drawn reproducibly with
    `spread` so that their lookup prefix (verify_tuner.batches.prefix_of) is `prefix`."""

    H: int
    q_len: int
    prefix: int
    kv_dtype: str = DEFAULT_KV_DTYPE  # the KV cache's format (verify_tuner.keys: the key's kv_dtype)
    batch: int = 1
    spread: str = "uniform"
    #: How the launches are timed: 0 back to back; N > 0 each followed by a bf16 GEMM streaming N MB
    #: of weights (the rest of an engine's layer, which leaves the kernel's caches cold), whose own
    #: time is subtracted (verify_tuner.kernels.timing.neighbour_gemm)
    neighbour_mb: int = 0

    def __post_init__(self) -> None:
        from verify_tuner import batches
        from verify_tuner.kernels.timing import check_neighbour_mb

        check_kv_dtype(self.kv_dtype)  # ValueError naming the accepted ones
        batches.bucket_of(self.batch)  # ValueError naming the range
        if self.spread not in batches.SPREADS:
            raise ValueError(f"spread must be one of {batches.SPREADS}, got {self.spread!r}")
        check_neighbour_mb(self.neighbour_mb)

    def prefix_lens(self) -> list[int]:
        from verify_tuner import batches

        return batches.draw_prefixes(batch=self.batch, centre=self.prefix, spread=self.spread)


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
    @property
    def limits(self) -> DeviceLimits: ...

    def measure(self, cfg: KernelConfig, workload: Workload) -> Measurement:
        """Compile (cached), check against the fp32 reference, then time `cfg` on `workload`."""
        ...

    def remeasure(self, cfgs: list[KernelConfig], workload: Workload, rounds: int) -> list[Measurement]:
        """Time already-checked configs interleaved (A/B/A/B...) so drift hits all alike."""
        ...

    def compile_ahead(self, cfg: KernelConfig, workload: Workload) -> None:
        """Build `cfg` for `workload` (its q_len and KV format) now, in the calling thread, so its measurement finds it built (the tuner
        calls this from several threads while another trial measures). A compile error is left
        for the measurement to report; backends that build nothing do nothing."""
        ...

    def close(self) -> None: ...
