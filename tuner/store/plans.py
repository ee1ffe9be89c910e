"""Queries for graph plans and verifications, keyword-only, each taking the session (beside
verify_tuner.store.devices and best_configs, whose devices, kernels and best rows they use).
Every write bumps data_version first, as every writer does: the sidecar's tables change with it.

A graph plan is a set of prefix ranges chosen together for one batch bucket from one side-by-side
measurement (verify_tuner.search.graph_ranges), one row a range: it is stored whole
(`store_plan_set`), served whole (`served_sets`: the newest set per batch bucket, never ranges of
two sets) and deleted whole (`delete_plans`)."""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session
from verify_tuner import buckets
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.keys import ConfigKey, TableKey
from verify_tuner.store import best_configs, data_version, devices, keyed, writes
from verify_tuner.store.models import BestConfig, Device, GraphPlan, Verification, utcnow


@dataclass(frozen=True)
class PlanRow:
    """One range of a stored graph plan set, detached from the session. The set's key: the table, the
    batch bucket, the prefix buckets measured (bucket_lo..bucket_hi) and the weights' digest; the
    range's own buckets are range_lo..range_hi. `per_bucket`: one dict a prefix bucket of the range,
    in bucket order (bucket, prefix, weight, us, p10_us, p90_us, best_us, regret, best)."""

    table: TableKey
    batch_bucket: int
    bucket_lo: int
    bucket_hi: int
    range_lo: int
    range_hi: int
    weights_digest: str
    weights: dict[str, Any]
    config: KernelConfig
    expected_us: float
    per_bucket: list[dict[str, Any]]
    finalists: list[dict[str, Any]] = field(default_factory=list)
    batch: int = 1
    spread: str = "uniform"
    rounds: int = 0
    measured_by: str = ""
    measured_at: dt.datetime | None = None
    neighbour_mb: int = 0  # how its times were measured (verify_tuner.measure.backend.Workload)
    max_graphs: int = 1  # how its set was chosen (verify_tuner.search.graph_ranges.choose_ranges)
    min_saving: float = 0.0
    #: the set's expected µs with 1, 2, ... graphs (None: no such split); empty for sets stored before ranges
    by_count: list[float | None] = field(default_factory=list)

    @property
    def set_key(self) -> tuple[Any, ...]:
        """What the ranges of one set share, and no other set of the table does."""
        return (self.table, self.batch_bucket, self.bucket_lo, self.bucket_hi, self.weights_digest)

    def regret_at(self, bucket: int) -> float | None:
        for b in self.per_bucket:
            if b["bucket"] == bucket:
                return b["regret"]
        return None


@dataclass(frozen=True)
class PlanSet:
    """The ranges of one set in prefix order: together they tile its measured range."""

    ranges: tuple[PlanRow, ...]

    def __post_init__(self) -> None:
        r = self.ranges
        if not r or any(p.set_key != r[0].set_key for p in r):
            raise ValueError("a plan set is one or more ranges of the same set")
        edges = [(p.range_lo, p.range_hi) for p in r]
        starts = [r[0].bucket_lo] + [hi + 1 for _, hi in edges[:-1]]
        tiled = [lo for lo, _ in edges] == starts and edges[-1][1] == r[0].bucket_hi
        if not tiled or any(lo > hi for lo, hi in edges):
            raise ValueError(f"ranges {edges} do not tile prefix buckets {r[0].bucket_lo}..{r[0].bucket_hi}")

    @property
    def breakpoints(self) -> tuple[int, ...]:
        """The prefix (tokens) at which each range after the first starts."""
        return tuple(buckets.by_index(p.range_lo).lo for p in self.ranges[1:])

    def index_of(self, prefix: int) -> int:
        """The range serving a batch whose longest prefix is `prefix`: the first one also serves
        prefixes below the measured range, the last one those above it."""
        return bisect.bisect_right(self.breakpoints, prefix)


def _set_columns(plan: PlanRow) -> dict[str, Any]:
    return {name: getattr(plan, name) for name in _PLAN_FIELDS} | {
        "params": plan.config.as_params(),
        "measured_at": plan.measured_at or utcnow(),
    }


def _key_of(session: Session, plan: PlanRow) -> dict[str, Any]:
    device_id, kernel_id = devices.key_ids(
        session=session, device=plan.table.device, kernel_hash=plan.table.kernel_hash
    )
    return {
        **keyed.key_columns(device_id, kernel_id, plan.table),
        "batch_bucket": plan.batch_bucket,
        "bucket_lo": plan.bucket_lo,
        "bucket_hi": plan.bucket_hi,
        "weights_digest": plan.weights_digest,
    }


def upsert_plan(*, session: Session, plan: PlanRow) -> None:
    """Store one range, replacing the row of the same set key and range start (a copy of a stored
    set, range by range: verify_tuner.store.snapshot). A new measurement is `store_plan_set`."""
    data_version.bump_version(session)  # first, like every writer (one lock order)
    key = _key_of(session, plan) | {"range_lo": plan.range_lo}
    writes.upsert(session, GraphPlan, key_cols=key, values=_set_columns(plan))


def store_plan_set(*, session: Session, plans: Sequence[PlanRow]) -> None:
    """Store the ranges chosen together, replacing the whole set of the same key (its table, batch
    bucket, range measured and weights' digest): a re-measurement supersedes the last one, whatever
    its breakpoints were. ValueError when the ranges are not one set that tiles its range."""
    chosen = PlanSet(tuple(plans))
    data_version.bump_version(session)
    key = _key_of(session, chosen.ranges[0])
    session.execute(delete(GraphPlan).where(*(getattr(GraphPlan, k) == v for k, v in key.items())))
    at = chosen.ranges[0].measured_at or utcnow()  # one time for the set: it was measured once
    for p in chosen.ranges:
        values = _set_columns(p) | {"measured_at": at}
        writes.upsert(session, GraphPlan, key_cols=key | {"range_lo": p.range_lo}, values=values)


#: What a plan's table row and its PlanRow hold under the same name (beside its key and config).
_PLAN_FIELDS = (
    "range_hi",
    "weights",
    "expected_us",
    "per_bucket",
    "finalists",
    "batch",
    "spread",
    "rounds",
    "measured_by",
    "neighbour_mb",
    "max_graphs",
    "min_saving",
    "by_count",
)


def delete_plans(*, session: Session, device: str, bucket: int | None = None, **filters: int | str | None) -> int:
    """Delete the graph plan sets built from the best configs these filters select (best_configs.
    delete_best's): a set is chosen over its range's bests, so it goes whole with any of them;
    `bucket` selects the sets whose measured range holds that prefix bucket. The rows deleted."""
    held = () if bucket is None else (GraphPlan.bucket_lo <= bucket, GraphPlan.bucket_hi >= bucket)
    return keyed.delete_keyed(session=session, model=GraphPlan, device=device, filters=filters, also=held)


def list_plans(*, session: Session, **filters: object) -> list[PlanRow]:
    """Stored ranges whose key fields have the values given (device, H, ...; None: any), newest
    measurement first within each (device, H, q_len, batch bucket), a set's ranges together in
    prefix order."""
    order = keyed.columns(GraphPlan, "H", "q_len", "batch_bucket")
    q = keyed.select_keyed(GraphPlan, **filters)
    q = q.order_by(
        Device.name,
        *order,
        GraphPlan.measured_at.desc(),
        GraphPlan.bucket_lo,
        GraphPlan.bucket_hi,
        GraphPlan.weights_digest,
        GraphPlan.range_lo,
    )
    return [_plan_row(*r) for r in session.execute(q)]


def served_sets(*, session: Session, table: TableKey) -> dict[int, PlanSet]:
    """The plan set served per batch bucket of `table`: the most recently measured one (whatever its
    range or weights: the operator's latest `study graph-plan` for that batch bucket), all its ranges."""
    newest: dict[int, list[PlanRow]] = {}
    for p in list_plans(session=session, **table.values()):
        got = newest.setdefault(p.batch_bucket, [p])
        if p is not got[0] and p.set_key == got[0].set_key:
            got.append(p)
    return {bb: PlanSet(tuple(rows)) for bb, rows in newest.items()}


def _plan_row(p: GraphPlan, device: str, kernel_hash: str) -> PlanRow:
    return PlanRow(
        table=keyed.row_key(p, device, kernel_hash, TableKey),
        batch_bucket=p.batch_bucket,
        bucket_lo=p.bucket_lo,
        bucket_hi=p.bucket_hi,
        range_lo=p.range_lo,
        weights_digest=p.weights_digest,
        config=KernelConfig.from_params(p.params),
        measured_at=p.measured_at,
        **{name: getattr(p, name) for name in _PLAN_FIELDS if name != "by_count"},
        by_count=list(p.by_count or []),
    )


# --- verifications ---------------------------------------------------------------------------
@dataclass(frozen=True)
class VerificationRow:
    key: ConfigKey
    config: KernelConfig
    stored_us: float | None
    measured_us: float | None
    measured_p10_us: float | None
    measured_p90_us: float | None
    heuristic: KernelConfig
    heuristic_us: float | None
    heuristic_p10_us: float | None
    heuristic_p90_us: float | None
    noise: float | None
    verdict: str  # ok | moved | stale | failed
    reason: str
    measured_by: str
    verified_at: dt.datetime | None = None
    neighbour_mb: int = 0  # how it re-timed (the row's own condition)


#: What a verification's table row and its VerificationRow hold under the same name.
_VERIFICATION_FIELDS = (
    "stored_us",
    "measured_us",
    "measured_p10_us",
    "measured_p90_us",
    "heuristic_us",
    "heuristic_p10_us",
    "heuristic_p90_us",
    "noise",
    "verdict",
    "reason",
    "measured_by",
    "neighbour_mb",
)


def _verification_fields(v: VerificationRow | Verification) -> dict[str, Any]:
    return {name: getattr(v, name) for name in _VERIFICATION_FIELDS}


def record_verification(*, session: Session, v: VerificationRow) -> bool:
    """Keep `v` in the history and mark the stored best with its verdict, unless the row no longer
    holds the config verified (re-tuned meanwhile: that row was not verified). True: marked."""
    data_version.bump_version(session)
    device_id, kernel_id = devices.key_ids(session=session, device=v.key.device, kernel_hash=v.key.kernel_hash)
    at = v.verified_at or utcnow()
    key = keyed.key_columns(device_id, kernel_id, v.key)
    session.add(
        Verification(
            **key,
            params=v.config.as_params(),
            heuristic_params=v.heuristic.as_params(),
            **_verification_fields(v),
            verified_at=at,
        )
    )
    if v.verdict == "failed":  # nothing was learnt about the row's speed: its mark stays as it was
        return False
    # writers are serialised by the version bump above: the row read here is the one marked
    row = session.scalars(
        select(BestConfig).where(*(getattr(BestConfig, k) == val for k, val in key.items()))
    ).one_or_none()
    if row is None or best_configs.to_best_row(row, v.key.device, v.key.kernel_hash).config != v.config:
        return False
    row.verdict, row.verified_at = v.verdict, at
    return True


def list_verifications(*, session: Session, device: str | None = None) -> list[VerificationRow]:
    q = keyed.select_keyed(Verification, device=device).order_by(Verification.id)
    return [
        VerificationRow(
            key=keyed.row_key(v, dev, khash, ConfigKey),
            config=KernelConfig.from_params(v.params),
            heuristic=KernelConfig.from_params(v.heuristic_params),
            **_verification_fields(v),
            verified_at=v.verified_at,
        )
        for v, dev, khash in session.execute(q)
    ]
