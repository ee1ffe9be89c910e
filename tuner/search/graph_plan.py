"""The graph plan of a batch bucket: the one config an engine captures into the CUDA graph of that
batch size, chosen to minimise the expected step time over the prefixes the graph will replay.

Pure: it takes the finalists (the batch bucket's per-prefix-bucket winners plus the heuristic
default), their times measured side by side at every prefix bucket of the range (one call of
verify_tuner.measure.matrix, never numbers from different runs) and the prefix distribution
(verify_tuner.search.prefix_weights), and returns the plan with, per bucket, its time and its
regret (its time / the fastest finalist's time at that bucket).

A finalist that failed at any bucket of the range cannot be captured for the whole range and is
not eligible; it still counts as that bucket's best where it ran (a bucket's best is the best
config for that bucket alone). Ties are broken the same way on every rank and for every input
order: lower expected time, then lower worst regret, then the config's constants in
PARAM_NAMES order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.search.prefix_weights import PrefixWeights


@dataclass(frozen=True)
class BucketCost:
    """The plan at one prefix bucket."""

    bucket: int
    weight: float
    us: float
    best_us: float
    best: KernelConfig

    @property
    def regret(self) -> float:
        return self.us / self.best_us


@dataclass(frozen=True)
class Plan:
    config: KernelConfig
    expected_us: float
    buckets: tuple[BucketCost, ...]
    #: every eligible finalist with its expected time, best first (what the log shows)
    ranking: tuple[tuple[KernelConfig, float], ...]
    #: finalists that failed at some bucket, with the buckets
    ineligible: tuple[tuple[KernelConfig, tuple[int, ...]], ...] = ()

    @property
    def worst_regret(self) -> float:
        return max(b.regret for b in self.buckets)

    @property
    def geomean_regret(self) -> float:
        return math.exp(sum(math.log(b.regret) for b in self.buckets) / len(self.buckets))


def order_key(cfg: KernelConfig) -> tuple[int, ...]:
    """The deterministic order of configs (a tie-break)."""
    return tuple(cfg.as_params().values())


def _ok(t: float | None) -> bool:
    return t is not None and math.isfinite(t) and t > 0


def _ran(t: float | None) -> float:
    """A time _ok() accepted."""
    assert t is not None and _ok(t), t
    return t


def choose(
    *,
    configs: Sequence[KernelConfig],
    bucket_indices: Sequence[int],
    times: Sequence[Sequence[float | None]],
    weights: PrefixWeights,
) -> Plan:
    """`times[i][j]`: median µs of `configs[i]` at prefix bucket `bucket_indices[j]` (None or
    non-finite: it failed there). ValueError when the inputs disagree or nothing can be chosen."""
    _check_shapes(configs, bucket_indices, times, weights)
    cols = sorted(range(len(bucket_indices)), key=lambda j: bucket_indices[j])  # a fixed summation order
    best = _fastest_per_bucket(configs, bucket_indices, times, cols)
    eligible, ineligible = [], []
    for i, cfg in enumerate(configs):
        failed = tuple(bucket_indices[j] for j in cols if not _ok(times[i][j]))
        if failed:
            ineligible.append((cfg, failed))
        else:
            eligible.append(i)
    if not eligible:
        raise ValueError("every finalist failed at some prefix bucket of the range: no config serves it all")

    def expected(i: int) -> float:
        return sum(weights.weights[bucket_indices[j]] * _ran(times[i][j]) for j in cols)

    def worst(i: int) -> float:
        return max(_ran(times[i][j]) / best[j][0] for j in cols)

    ranked = sorted(eligible, key=lambda i: (expected(i), worst(i), order_key(configs[i])))
    win = ranked[0]
    costs = tuple(
        BucketCost(
            bucket=bucket_indices[j],
            weight=weights.weights[bucket_indices[j]],
            us=_ran(times[win][j]),
            best_us=best[j][0],
            best=best[j][1],
        )
        for j in cols
    )
    return Plan(
        config=configs[win],
        expected_us=expected(win),
        buckets=costs,
        ranking=tuple((configs[i], expected(i)) for i in ranked),
        ineligible=tuple(sorted(ineligible, key=lambda ci: order_key(ci[0]))),
    )


def _fastest_per_bucket(
    configs: Sequence[KernelConfig],
    bucket_indices: Sequence[int],
    times: Sequence[Sequence[float | None]],
    cols: list[int],
) -> dict[int, tuple[float, KernelConfig]]:
    """Column j -> (time, config) of the fastest finalist that ran at bucket_indices[j]."""
    best: dict[int, tuple[float, KernelConfig]] = {}
    for j in cols:
        ran = [(_ran(times[i][j]), configs[i]) for i in range(len(configs)) if _ok(times[i][j])]
        if not ran:
            raise ValueError(f"no finalist ran at prefix bucket {bucket_indices[j]}")
        best[j] = min(ran, key=lambda tc: (tc[0], order_key(tc[1])))
    return best


def _check_shapes(
    configs: Sequence[KernelConfig],
    bucket_indices: Sequence[int],
    times: Sequence[Sequence[float | None]],
    weights: PrefixWeights,
) -> None:
    if not configs or not bucket_indices:
        raise ValueError("need at least one finalist and one prefix bucket")
    if len(set(configs)) != len(configs) or len(set(bucket_indices)) != len(bucket_indices):
        raise ValueError("finalists and prefix buckets must be distinct")
    if len(times) != len(configs) or any(len(row) != len(bucket_indices) for row in times):
        raise ValueError(f"times must be {len(configs)} x {len(bucket_indices)} (finalists x buckets)")
    if set(weights.weights) != set(bucket_indices):
        raise ValueError(f"weights cover buckets {sorted(weights.weights)}, the times {sorted(bucket_indices)}")


def weighted_by(weights: Mapping[int, float]) -> PrefixWeights:
    """Weights given directly (bucket index -> weight), normalised: for callers and tests."""
    total = sum(weights.values())
    return PrefixWeights({b: w / total for b, w in weights.items()}, source="given")
