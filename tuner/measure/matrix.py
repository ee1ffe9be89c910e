"""Several configs timed side by side at several workloads: a matrix config x workload from one
call, through the Backend interface only (its `measure` to compile and gate each pair, its
`remeasure` to time the configs that passed, interleaved).

Why one call and interleaved: a graph plan compares each config against the best one at every
prefix bucket, and a verification compares a stored best with the heuristic; numbers from
different runs (another boot, clock or driver) differ by more than the choices they decide. Within
a workload the backend interleaves the configs (A/B/A/B); across `passes` the workloads are walked
forward then backward and the configs' order rotated, so drift over the call hits every cell alike.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.validate import check
from verify_tuner.measure.backend import INVALID, OK, Backend, Measurement, Workload


@dataclass(frozen=True)
class Cell:
    """One config at one workload: the pooled re-timings, or why it has none."""

    state: str
    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    samples: list[float] = field(default_factory=list)
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.state == OK and self.median_us is not None

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the measured noise, relative."""
        if not self.ok or self.p10_us is None or self.p90_us is None:
            return 0.0
        return max(self.p90_us - self.p10_us, 0.0) / self.median_us  # type: ignore[operator]


@dataclass(frozen=True)
class Matrix:
    configs: tuple[KernelConfig, ...]
    workloads: tuple[Workload, ...]
    cells: tuple[tuple[Cell, ...], ...]  # [config][workload]

    def cell(self, cfg: KernelConfig, wl: Workload) -> Cell:
        return self.cells[self.configs.index(cfg)][self.workloads.index(wl)]

    def medians(self) -> list[list[float | None]]:
        return [[c.median_us if c.ok else None for c in row] for row in self.cells]


def _rotated(items: Sequence[int], by: int) -> list[int]:
    if not items:
        return []
    k = by % len(items)
    return list(items[k:]) + list(items[:k])


def measure_matrix(
    backend: Backend,
    configs: Sequence[KernelConfig],
    workloads: Sequence[Workload],
    *,
    rounds: int = 3,
    passes: int = 2,
) -> Matrix:
    """Every config at every workload. Each pair is gated first (`measure`: compile, check against
    the reference, a first timing that is not kept); the configs that passed at a workload are then
    timed together there (`remeasure`) on each of `passes`. A pair that fails the gate or a
    re-timing keeps the failure's state and reason and has no time."""
    if len(set(configs)) != len(configs) or len(set(workloads)) != len(workloads):
        raise ValueError("configs and workloads must be distinct")
    n, m = len(configs), len(workloads)
    gate: list[list[Measurement | None]] = [[None] * m for _ in range(n)]
    for j, wl in enumerate(workloads):
        for i in _rotated(range(n), j):
            why = check(configs[i], backend.limits, H=wl.H, q_len=wl.q_len, kv_dtype=wl.kv_dtype)
            gate[i][j] = Measurement(INVALID, reason=why) if why else backend.measure(configs[i], wl)
    samples: list[list[list[float]]] = [[[] for _ in range(m)] for _ in range(n)]
    failed: dict[tuple[int, int], Measurement] = {}
    for p in range(passes):
        order = range(m) if p % 2 == 0 else range(m - 1, -1, -1)
        for j in order:
            live = [i for i in _rotated(range(n), p + j) if gate[i][j].ok and (i, j) not in failed]  # type: ignore[union-attr]
            if not live:
                continue
            for i, meas in zip(live, backend.remeasure([configs[i] for i in live], workloads[j], rounds)):
                if not meas.ok:
                    failed[(i, j)] = meas
                else:
                    samples[i][j] += meas.samples or [meas.median_us]  # type: ignore[list-item]
    cells = tuple(
        tuple(_cell(gate[i][j], failed.get((i, j)), samples[i][j]) for j in range(m))  # type: ignore[arg-type]
        for i in range(n)
    )
    return Matrix(tuple(configs), tuple(workloads), cells)


def _cell(gate: Measurement, failure: Measurement | None, samples: list[float]) -> Cell:
    if not gate.ok:
        return Cell(gate.state, reason=gate.reason)
    if failure is not None:
        return Cell(failure.state, reason=failure.reason)
    if not samples:
        return Cell(OK, gate.median_us, gate.p10_us, gate.p90_us, list(gate.samples))
    s = sorted(samples)
    deciles = statistics.quantiles(s, n=10, method="inclusive") if len(s) >= 2 else [s[0]] * 9
    return Cell(OK, statistics.median(s), deciles[0], deciles[-1], samples)
