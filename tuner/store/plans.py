"""Queries for graph plans and verifications, keyword-only, each taking the session (beside
verify_tuner.store.devices and best_configs, whose devices, kernels and best rows they use).
Every write bumps data_version first, as every writer does: the sidecar's tables change with it."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.keys import ConfigKey, TableKey
from verify_tuner.store import best_configs, data_version, devices, keyed, writes
from verify_tuner.store.models import BestConfig, Device, GraphPlan, Verification, utcnow


@dataclass(frozen=True)
class PlanRow:
    """A stored graph plan, detached from the session. `per_bucket`: one dict a prefix bucket of the
    range, in bucket order (bucket, prefix, weight, us, p10_us, p90_us, best_us, regret, best)."""

    table: TableKey
    batch_bucket: int
    bucket_lo: int
    bucket_hi: int
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

    def regret_at(self, bucket: int) -> float | None:
        for b in self.per_bucket:
            if b["bucket"] == bucket:
                return b["regret"]
        return None


def upsert_plan(*, session: Session, plan: PlanRow) -> None:
    """Store `plan`, replacing the plan of the same key (its table, batch bucket, range and weights'
    digest): a re-measurement supersedes the last one."""
    data_version.bump_version(session)  # first, like every writer (one lock order)
    device_id, kernel_id = devices.key_ids(
        session=session, device=plan.table.device, kernel_hash=plan.table.kernel_hash
    )
    key = {
        **keyed.key_columns(device_id, kernel_id, plan.table),
        "batch_bucket": plan.batch_bucket,
        "bucket_lo": plan.bucket_lo,
        "bucket_hi": plan.bucket_hi,
        "weights_digest": plan.weights_digest,
    }
    values = {name: getattr(plan, name) for name in _PLAN_FIELDS} | {
        "params": plan.config.as_params(),
        "measured_at": plan.measured_at or utcnow(),
    }
    writes.upsert(session, GraphPlan, key_cols=key, values=values)


#: What a plan's table row and its PlanRow hold under the same name (beside its key and config).
_PLAN_FIELDS = (
    "weights",
    "expected_us",
    "per_bucket",
    "finalists",
    "batch",
    "spread",
    "rounds",
    "measured_by",
    "neighbour_mb",
)


def delete_plans(*, session: Session, device: str, bucket: int | None = None, **filters: int | None) -> int:
    """Delete the graph plans built from the best configs these filters select (best_configs.
    delete_best's): a plan is chosen over its range's bests, so it goes with any of them; `bucket`
    selects the plans whose range holds that prefix bucket."""
    held = () if bucket is None else (GraphPlan.bucket_lo <= bucket, GraphPlan.bucket_hi >= bucket)
    return keyed.delete_keyed(session=session, model=GraphPlan, device=device, filters=filters, also=held)


def list_plans(*, session: Session, **filters: object) -> list[PlanRow]:
    """Stored plans whose key fields have the values given (device, H, ...; None: any), newest
    measurement first within each (device, H, q_len, batch bucket)."""
    order = keyed.columns(GraphPlan, "H", "q_len", "batch_bucket")
    q = keyed.select_keyed(GraphPlan, **filters)
    q = q.order_by(Device.name, *order, GraphPlan.measured_at.desc(), GraphPlan.id)
    return [_plan_row(*r) for r in session.execute(q)]


def served_plans(*, session: Session, table: TableKey) -> dict[int, PlanRow]:
    """The plan served per batch bucket of `table`: the most recently measured one (whatever its
    range or weights: the operator's latest `study graph-plan` for that batch bucket)."""
    out: dict[int, PlanRow] = {}
    for p in list_plans(session=session, **table.values()):
        out.setdefault(p.batch_bucket, p)
    return out


def _plan_row(p: GraphPlan, device: str, kernel_hash: str) -> PlanRow:
    return PlanRow(
        table=keyed.row_key(p, device, kernel_hash, TableKey),
        batch_bucket=p.batch_bucket,
        bucket_lo=p.bucket_lo,
        bucket_hi=p.bucket_hi,
        weights_digest=p.weights_digest,
        config=KernelConfig.from_params(p.params),
        measured_at=p.measured_at,
        **{name: getattr(p, name) for name in _PLAN_FIELDS},
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


def plan_doc(p: PlanRow) -> dict[str, Any]:
    """A plan as the sidecar (GET /config, /configs) and the engine files serve it: one shape, which
    the worker client reads from either (api/schemas.GraphPlanOut documents it)."""
    import math

    from verify_tuner import batches, buckets

    bb = batches.by_index(p.batch_bucket)
    regrets = [b["regret"] for b in p.per_bucket]
    return {
        **p.config.as_params(),
        "batch_bucket": {"index": bb.index, "lo": bb.lo, "hi": bb.hi},
        "prefix_lo": buckets.by_index(p.bucket_lo).lo,
        "prefix_hi": buckets.by_index(p.bucket_hi).hi,
        "expected_us": p.expected_us,
        "regret_geomean": math.exp(sum(math.log(r) for r in regrets) / len(regrets)) if regrets else None,
        "regret_worst": max(regrets) if regrets else None,
        "weights_digest": p.weights_digest,
        "weights_source": p.weights.get("source"),
        "measured_at": p.measured_at.isoformat() if p.measured_at else None,
        "measured_by": p.measured_by,
        "neighbour_mb": p.neighbour_mb,
        "buckets": [
            {
                "prefix_lo": buckets.by_index(b["bucket"]).lo,
                "prefix_hi": buckets.by_index(b["bucket"]).hi,
                "prefix": b.get("prefix"),
                "weight": b.get("weight"),
                "us": b["us"],
                "best_us": b["best_us"],
                "regret": b["regret"],
            }
            for b in p.per_bucket
        ],
    }
