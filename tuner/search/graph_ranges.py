"""Graphs per prefix range: up to K configs for one batch bucket, each captured into its own CUDA
graph and replayed for the steps whose longest prefix falls in its range, with the breakpoints
chosen to minimise the expected step time under the prefix distribution.

Pure, like verify_tuner.search.graph_plan (whose `choose` picks each range's config from the same
side-by-side measurements): contiguous ranges of prefix buckets, found exactly by dynamic
programming over the buckets. A graph costs capture time and memory, so a range is split again
only while the split saves at least `min_saving` of the expected time of the plan without it.
Ties go to fewer graphs, then to the earlier breakpoints: every rank decides the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.search.graph_plan import Plan, _check_shapes, _fastest_per_bucket, choose
from verify_tuner.search.prefix_weights import PrefixWeights

#: The share of the expected step time a further graph must save (a graph per range costs its
#: capture and its memory; 2 % is about what run-to-run noise allows to be called a gain).
MIN_SAVING = 0.02


@dataclass(frozen=True)
class RangedPlan:
    """Each range's plan, in prefix order; `expected_us` is the step's expectation over them all."""

    ranges: tuple[Plan, ...]
    expected_us: float
    #: the expected time with 1, 2, ... graphs (the best split of each count; inf: no such split), for the log
    by_count: tuple[float, ...]

    @property
    def breakpoints(self) -> tuple[int, ...]:
        """The first prefix bucket of every range after the first."""
        return tuple(p.buckets[0].bucket for p in self.ranges[1:])

    @property
    def worst_regret(self) -> float:
        return max(p.worst_regret for p in self.ranges)

    @property
    def geomean_regret(self) -> float:
        regrets = [b.regret for p in self.ranges for b in p.buckets]
        return math.exp(sum(math.log(r) for r in regrets) / len(regrets))


def choose_ranges(
    *,
    configs: Sequence[KernelConfig],
    bucket_indices: Sequence[int],
    times: Sequence[Sequence[float | None]],
    weights: PrefixWeights,
    max_graphs: int = 2,
    min_saving: float = MIN_SAVING,
) -> RangedPlan:
    """As graph_plan.choose, with up to `max_graphs` ranges (times[i][j]: configs[i] at bucket
    bucket_indices[j]); ValueError when the inputs disagree or nothing can be chosen."""
    if max_graphs < 1:
        raise ValueError(f"max_graphs must be at least 1, got {max_graphs}")
    if not 0 <= min_saving < 1:
        raise ValueError(f"min_saving must be a share in [0, 1), got {min_saving}")
    _check_shapes(configs, bucket_indices, times, weights)
    cols = sorted(range(len(bucket_indices)), key=lambda j: bucket_indices[j])
    _fastest_per_bucket(configs, bucket_indices, times, cols)  # every bucket has a finalist that ran
    seg = _segment_costs(configs, cols, times, [weights.weights[bucket_indices[j]] for j in cols])
    best = _splits(seg, len(cols), max_graphs)
    count = next((k for k in range(1, max_graphs + 1) if best[k] is not None), None)
    if count is None:
        raise ValueError(
            f"no split into at most {max_graphs} graphs has, for each graph, a finalist that ran at all its buckets"
        )
    while count < max_graphs and best[count + 1] is not None:
        gain = best[count][0] - best[count + 1][0]  # type: ignore[index]
        if gain < min_saving * best[count][0] or gain <= 0:  # type: ignore[index]
            break
        count += 1
    cost, cuts = best[count]  # type: ignore[misc]
    ranges = [
        _range_plan(configs, bucket_indices, times, weights, cols[a:b]) for a, b in zip((0, *cuts), (*cuts, len(cols)))
    ]
    by_count = tuple(b[0] if b is not None else math.inf for b in best[1:])
    return RangedPlan(tuple(ranges), cost, by_count)


def _segment_costs(
    configs: Sequence[KernelConfig], cols: list[int], times: Sequence[Sequence[float | None]], w: list[float]
) -> list[list[float]]:
    """seg[a][b]: the least weighted time of one config over sorted columns a..b-1 (inf: none ran at all)."""
    n = len(cols)
    seg = [[math.inf] * (n + 1) for _ in range(n + 1)]
    for i in range(len(configs)):
        for a in range(n):
            total = 0.0
            for b in range(a + 1, n + 1):
                t = times[i][cols[b - 1]]
                if t is None or not math.isfinite(t) or t <= 0:
                    break  # this config cannot serve a range holding that bucket
                total += w[b - 1] * t
                seg[a][b] = min(seg[a][b], total)
    return seg


def _splits(seg: list[list[float]], n: int, k_max: int) -> list[tuple[float, tuple[int, ...]] | None]:
    """best[k]: (cost, cut columns) of the cheapest cover of columns 0..n-1 by k ranges, or None."""
    # dp[k][b]: cheapest cover of columns 0..b-1 by k ranges; ties keep the earlier cuts
    dp: list[list[tuple[float, tuple[int, ...]] | None]] = [[None] * (n + 1) for _ in range(k_max + 1)]
    dp[0][0] = (0.0, ())
    for k in range(1, k_max + 1):
        for b in range(1, n + 1):
            for a in range(k - 1, b):
                prev = dp[k - 1][a]
                if prev is None or not math.isfinite(seg[a][b]):
                    continue
                cand = (prev[0] + seg[a][b], (*prev[1], a) if a else prev[1])
                cur = dp[k][b]
                if cur is None or (cand[0], cand[1]) < (cur[0], cur[1]):
                    dp[k][b] = cand
    return [None] + [dp[k][n] for k in range(1, k_max + 1)]


def _range_plan(
    configs: Sequence[KernelConfig],
    bucket_indices: Sequence[int],
    times: Sequence[Sequence[float | None]],
    weights: PrefixWeights,
    cols: list[int],
) -> Plan:
    """graph_plan.choose over the columns `cols`, with the range's weights renormalised (equal if
    the distribution puts none there)."""
    idx = [bucket_indices[j] for j in cols]
    total = sum(weights.weights[b] for b in idx)
    sub = {b: (weights.weights[b] / total if total > 0 else 1 / len(idx)) for b in idx}
    plan = choose(
        configs=configs,
        bucket_indices=idx,
        times=[[row[j] for j in cols] for row in times],
        weights=PrefixWeights(sub, source=weights.source, outside=weights.outside),
    )
    return plan
