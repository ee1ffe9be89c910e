"""Choosing and storing the graph plan sets of (H, q_len, prefix range) for some batch sizes: the
stored per-prefix-bucket winners of each batch bucket plus the heuristic default are the
finalists, re-measured side by side at every prefix bucket of the range through the backend
(verify_tuner.measure.matrix), and the selection (verify_tuner.search.graph_ranges) picks up to K
of them, one an engine captures per prefix range, and the breakpoints between the ranges. Every
decision is logged with its measurements."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from verify_tuner import batches, buckets
from verify_tuner.errors import TunerError
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels import kernel_hash as current_kernel_hash
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.formats import DEFAULT as DEFAULT_KV_DTYPE
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.keys import TableKey
from verify_tuner.measure.backend import Backend, Workload
from verify_tuner.measure.matrix import Matrix, measure_matrix
from verify_tuner.search import graph_plan, graph_ranges
from verify_tuner.search.prefix_weights import PrefixWeights
from verify_tuner.store import best_configs, plans
from verify_tuner.store.session import session_scope

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanResult:
    batch: int
    ranged: graph_ranges.RangedPlan
    rows: list[plans.PlanRow]  # as stored: one a range, in prefix order
    matrix: Matrix
    heuristic: KernelConfig
    #: the heuristic's expected time over the whole range under the same weights (None: it failed somewhere)
    heuristic_us: float | None
    #: prefix buckets of the range with no stored winner (their best is among the finalists only)
    untuned: list[int] = field(default_factory=list)


def range_prefixes(lo: int, hi: int) -> list[tuple[buckets.Bucket, int]]:
    """Each bucket of [lo, hi] with the prefix it is measured at: its middle, clamped to the range
    (as `tuner study start --prefix-range` measures it)."""
    return [(b, min(max(b.mid, lo), hi)) for b in buckets.buckets_between(lo, hi)]


def measured_by(limits: DeviceLimits) -> str:
    return (
        f"{limits.name} (sm_{limits.cc_major}{limits.cc_minor}, driver {limits.driver_version or '?'}, "
        f"CUDA {limits.cuda_version or '?'})"
    )


@dataclass(frozen=True)
class PlanJob:
    """What the plan sets of one `tuner study graph-plan` share: the table's shape and KV format, the
    prefix range with its weights, how each finalist is measured (as `study start` measured the
    winners: `spread`, `neighbour_mb`) and how many ranges a set may have."""

    H: int
    q_len: int
    prefix_lo: int
    prefix_hi: int
    weights: PrefixWeights
    kv_dtype: str = DEFAULT_KV_DTYPE
    spread: str = "uniform"
    rounds: int = 3
    passes: int = 2
    neighbour_mb: int = 0
    #: how many prefix ranges (graphs per batch size) a set may have, and what a further one must save
    max_graphs: int = 2
    min_saving: float = graph_ranges.MIN_SAVING

    def table(self, limits: DeviceLimits) -> TableKey:
        """The answer table the plans are for: this device's, of the kernel this package launches."""
        return TableKey(limits.name, current_kernel_hash(), self.kv_dtype, self.H, self.q_len)

    def workload(self, prefix: int, batch: int) -> Workload:
        return Workload(
            self.H,
            self.q_len,
            prefix,
            kv_dtype=self.kv_dtype,
            batch=batch,
            spread=self.spread,
            neighbour_mb=self.neighbour_mb,
        )


def plan_batch(*, backend: Backend, sessions: sessionmaker[Session], job: PlanJob, batch: int) -> PlanResult:
    """Measure the finalists of batch size `batch` over the range, choose its plan set and store it.
    TunerError when the batch bucket has no stored winner in the range or nothing can be chosen."""
    limits, bb = backend.limits, batches.bucket_of(batch)
    points = range_prefixes(job.prefix_lo, job.prefix_hi)
    winners = _winners(sessions, job.table(limits), batch, points, job)
    default = heuristic_config(
        limits, H=job.H, q_len=job.q_len, prefix=job.prefix_hi, batch=batch, kv_dtype=job.kv_dtype
    )
    finalists = sorted({r.config for r in winners} | {default}, key=graph_plan.order_key)
    workloads = [job.workload(p, batch) for _, p in points]
    matrix = measure_matrix(backend, finalists, workloads, rounds=job.rounds, passes=job.passes)
    idx = [b.index for b, _ in points]
    try:
        ranged = graph_ranges.choose_ranges(
            configs=finalists,
            bucket_indices=idx,
            times=matrix.medians(),
            weights=job.weights,
            max_graphs=job.max_graphs,
            min_saving=job.min_saving,
        )
    except ValueError as exc:
        raise TunerError(f"H={job.H} q_len={job.q_len} batch {bb}: {exc}; " + _failures(matrix)) from None
    expected = {c: _expected(matrix, c, idx, job.weights) for c in matrix.configs}
    rows = [_row(p, ranged, matrix, points, limits, batch, job, expected) for p in ranged.ranges]
    with session_scope(sessions) as s:
        plans.store_plan_set(session=s, plans=rows)
    untuned = sorted(set(idx) - {r.key.bucket for r in winners})
    result = PlanResult(batch, ranged, rows, matrix, default, expected.get(default), untuned)
    _log(result)
    return result


def _expected(matrix: Matrix, cfg: KernelConfig, idx: list[int], weights: PrefixWeights) -> float | None:
    """`cfg`'s expected time over the whole range (None: it failed at some bucket)."""
    times = matrix.medians()[matrix.configs.index(cfg)]
    ran = [t for t in times if t is not None and math.isfinite(t) and t > 0]
    return sum(weights.weights[b] * t for b, t in zip(idx, ran)) if len(ran) == len(times) else None


def _winners(
    sessions: sessionmaker[Session],
    table: TableKey,
    batch: int,
    points: list[tuple[buckets.Bucket, int]],
    job: PlanJob,
) -> list[best_configs.BestRow]:
    """The stored winners of the batch bucket in the range; TunerError naming the command that tunes them."""
    in_range, bb = {b.index for b, _ in points}, batches.bucket_of(batch)
    with session_scope(sessions) as s:
        rows = best_configs.list_best_for(session=s, table=table, batch_bucket=bb.index)
    winners = [r for r in rows if r.key.bucket in in_range]
    if not winners:
        lo, hi = job.prefix_lo, job.prefix_hi
        raise TunerError(
            f"no tuned configs on {table.device} for H={job.H} q_len={job.q_len} {job.kv_dtype} batch {bb} in "
            f"prefixes {lo}:{hi}: tune them first (tuner study start --H {job.H} --q-len {job.q_len} "
            f"--kv-dtype {job.kv_dtype} --prefix-range {lo}:{hi} --batch {batch})"
        )
    return winners


def _row(
    plan: graph_plan.Plan,
    ranged: graph_ranges.RangedPlan,
    matrix: Matrix,
    points: list[tuple[buckets.Bucket, int]],
    limits: DeviceLimits,
    batch: int,
    job: PlanJob,
    expected: dict[KernelConfig, float | None],
) -> plans.PlanRow:
    """One range of the set, as stored."""
    w = job.weights
    return plans.PlanRow(
        table=job.table(limits),
        batch_bucket=batches.bucket_of(batch).index,
        bucket_lo=points[0][0].index,
        bucket_hi=points[-1][0].index,
        range_lo=plan.buckets[0].bucket,
        range_hi=plan.buckets[-1].bucket,
        weights_digest=w.digest,
        weights={"source": w.source, "outside": w.outside, "buckets": _str_keys(w.weights)},
        config=plan.config,
        expected_us=plan.expected_us,
        per_bucket=_per_bucket(plan, matrix, points, w),
        finalists=_finalists(matrix, points, expected),
        batch=batch,
        spread=job.spread,
        rounds=job.rounds,
        measured_by=measured_by(limits),
        neighbour_mb=matrix.workloads[0].neighbour_mb,
        max_graphs=job.max_graphs,
        min_saving=job.min_saving,
        by_count=[t if math.isfinite(t) else None for t in ranged.by_count],
    )


def _per_bucket(
    plan: graph_plan.Plan, matrix: Matrix, points: list[tuple[buckets.Bucket, int]], weights: PrefixWeights
) -> list[dict[str, Any]]:
    """The range's config at each prefix bucket of the range: its time, spread, regret and the
    bucket's share of the whole measured range's prefix distribution."""
    at = {b.index: (b, prefix, wl) for (b, prefix), wl in zip(points, matrix.workloads)}
    per_bucket = []
    for cost in plan.buckets:
        b, prefix, wl = at[cost.bucket]
        cell = matrix.cell(plan.config, wl)
        per_bucket.append(
            {
                "bucket": b.index,
                "prefix_lo": b.lo,
                "prefix_hi": b.hi,
                "prefix": prefix,
                "weight": weights.weights[b.index],
                "us": cost.us,
                "p10_us": cell.p10_us,
                "p90_us": cell.p90_us,
                "best_us": cost.best_us,
                "regret": cost.regret,
                "best": cost.best.as_params(),
            }
        )
    return per_bucket


def _finalists(
    matrix: Matrix, points: list[tuple[buckets.Bucket, int]], expected: dict[KernelConfig, float | None]
) -> list[dict[str, Any]]:
    """Every finalist's times across the range, its expected time over the whole range and where it
    failed (those with none)."""
    return [
        {
            "params": c.as_params(),
            "expected_us": expected.get(c),
            "us": [matrix.cell(c, wl).median_us for wl in matrix.workloads],
            "failed": {str(b.index): matrix.cell(c, wl).reason for (b, _), wl in zip(points, matrix.workloads)}
            if expected.get(c) is None
            else {},
        }
        for c in matrix.configs
    ]


def _str_keys(d: dict[int, float]) -> dict[str, float]:
    return {str(k): v for k, v in sorted(d.items())}


def _failures(matrix: Matrix) -> str:
    bad = [
        f"{c} at prefix {wl.prefix}: {cell.state} ({cell.reason})"
        for c, row in zip(matrix.configs, matrix.cells)
        for wl, cell in zip(matrix.workloads, row)
        if not cell.ok
    ]
    return "failed: " + "; ".join(bad[:5]) + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else "")


def _log(r: PlanResult) -> None:
    rp, table = r.ranged, r.rows[0].table
    log.info(
        "graph plan H=%d q_len=%d batch=%d: %d range(s), breakpoints %s, expected %.2f us (by graphs %s; heuristic "
        "%s: %s us), regret geomean %.3f worst %.3f",
        table.H,
        table.q_len,
        r.batch,
        len(rp.ranges),
        [buckets.by_index(b).lo for b in rp.breakpoints],
        rp.expected_us,
        [round(t, 3) for t in rp.by_count],
        r.heuristic,
        f"{r.heuristic_us:.2f}" if r.heuristic_us else "failed",
        rp.geomean_regret,
        rp.worst_regret,
    )
    for p, row in zip(rp.ranges, r.rows):
        log.info(
            "  range [%d, %d): %s, expected %.2f us; finalists %s",
            buckets.by_index(row.range_lo).lo,
            buckets.by_index(row.range_hi).hi,
            p.config,
            p.expected_us,
            [(str(c), round(us, 3)) for c, us in p.ranking],
        )
        for b in row.per_bucket:
            log.info(
                "    bucket [%d, %d) prefix %d weight %.3f: plan %.2f us, best %.2f us (%s), regret %.3f",
                b["prefix_lo"],
                b["prefix_hi"],
                b["prefix"],
                b["weight"],
                b["us"],
                b["best_us"],
                KernelConfig.from_params(b["best"]),
                b["regret"],
            )
        for c, failed in p.ineligible:
            log.info("    not eligible: %s failed at buckets %s", c, list(failed))
