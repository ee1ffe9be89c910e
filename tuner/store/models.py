"""Tables. Migrations under migrations/ create exactly these; a test compares the two."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A point in time stored and read back as UTC on every database. SQLite has no time zone
    type: SQLAlchemy writes an aware value's wall clock and drops its offset (12:00+05:00 came
    back as 12:00), where PostgreSQL converts it (07:00Z)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def timing_column() -> Any:
    """How a row's times were measured: 0 back-to-back replays, N each launch followed by a GEMM over
    N MB of weights, its own time subtracted (verify_tuner.measure.backend.Workload; migration 0005)."""
    return mapped_column(default=0, server_default="0")


class Base(DeclarativeBase):
    type_annotation_map: ClassVar = {dict[str, Any]: JSON, list[float]: JSON}


class Device(Base):
    __tablename__ = "devices"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    compute_capability: Mapped[str] = mapped_column(String(16))
    sm_count: Mapped[int]
    max_smem_optin: Mapped[int]
    smem_per_sm: Mapped[int]
    regs_per_sm: Mapped[int]
    regs_per_block: Mapped[int]
    max_threads_per_block: Mapped[int]
    l2_bytes: Mapped[int] = mapped_column(default=0)
    driver_version: Mapped[str | None] = mapped_column(String(32))
    cuda_version: Mapped[str | None] = mapped_column(String(32))
    copy_bw_gbps: Mapped[float | None] = mapped_column(Float)
    recorded_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class Kernel(Base):
    __tablename__ = "kernels"
    id: Mapped[int] = mapped_column(primary_key=True)
    source_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(100))
    version: Mapped[str] = mapped_column(String(32))


class Study(Base):
    __tablename__ = "tuning_studies"
    id: Mapped[int] = mapped_column(primary_key=True)
    workload_key: Mapped[str] = mapped_column(String(400), unique=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    kernel_id: Mapped[int] = mapped_column(ForeignKey("kernels.id"))
    dtype: Mapped[str] = mapped_column(String(16))
    H: Mapped[int]
    q_len: Mapped[int]
    bucket: Mapped[int]
    #: verify_tuner.batches index (0: B=1); migration 0003
    batch_bucket: Mapped[int] = mapped_column(default=0, server_default="0")
    prefix: Mapped[int]  # the prefix length measured for this bucket (the batch's lookup prefix)
    status: Mapped[str] = mapped_column(String(16), default="running")
    sampler: Mapped[str] = mapped_column(String(16))
    seed: Mapped[int | None]
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    n_trials: Mapped[int] = mapped_column(default=0)
    n_ok: Mapped[int] = mapped_column(default=0)
    n_invalid: Mapped[int] = mapped_column(default=0)
    n_failed: Mapped[int] = mapped_column(default=0)
    #: the tuner process that picks and stores this key's winner, and when it last said so
    #: (verify_tuner.jobs.claims; migration 0003): other processes only help with its trials
    owner: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    neighbour_mb: Mapped[int] = timing_column()


class Trial(Base):
    __tablename__ = "tuning_trials"
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuning_studies.id", ondelete="CASCADE"), index=True)
    params: Mapped[dict[str, Any]]
    #: ok | invalid | compile_error | wrong | crashed | timeout
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    median_us: Mapped[float | None] = mapped_column(Float)
    p10_us: Mapped[float | None] = mapped_column(Float)
    p90_us: Mapped[float | None] = mapped_column(Float)
    samples: Mapped[list[float] | None]
    rel_error: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class BestConfig(Base):
    __tablename__ = "best_configs"
    __table_args__ = (
        UniqueConstraint("device_id", "kernel_id", "dtype", "H", "q_len", "bucket", "batch_bucket", name="uq_best_key"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    kernel_id: Mapped[int] = mapped_column(ForeignKey("kernels.id"))
    dtype: Mapped[str] = mapped_column(String(16))
    H: Mapped[int]
    q_len: Mapped[int]
    bucket: Mapped[int]
    #: verify_tuner.batches index (0: B=1); migration 0003
    batch_bucket: Mapped[int] = mapped_column(default=0, server_default="0")
    nsplit: Mapped[int]
    ht: Mapped[int]
    tk: Mapped[int]
    block: Mapped[int]
    #: Constants beyond the four (STAGES, QT, WR, WK, SF, PIPE: KernelConfig.extra_params()); room for
    #: later knobs without a migration.
    extra: Mapped[dict[str, Any]] = mapped_column(default=dict)
    median_us: Mapped[float | None] = mapped_column(Float)
    p10_us: Mapped[float | None] = mapped_column(Float)
    p90_us: Mapped[float | None] = mapped_column(Float)
    default_us: Mapped[float | None] = mapped_column(Float)
    speedup: Mapped[float | None] = mapped_column(Float)
    study_id: Mapped[int | None] = mapped_column(ForeignKey("tuning_studies.id", ondelete="SET NULL"))
    tuned_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: the last `tuner configs verify` of this row since it was stored (ok | moved | stale); a
    #: stale row is not served; storing the row again (a re-tune, an import) clears both (0004)
    verdict: Mapped[str | None] = mapped_column(String(16))
    verified_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    neighbour_mb: Mapped[int] = timing_column()


class GraphPlan(Base):
    """The one config an engine captures per batch size for a prefix range (verify_tuner.search.graph_plan),
    with its time and regret at every prefix bucket of the range, all measured side by side in one
    call (migration 0004). Keyed by the range's bucket indices and the prefix weights' digest."""

    __tablename__ = "graph_plans"
    __table_args__ = (
        UniqueConstraint(
            "device_id",
            "kernel_id",
            "dtype",
            "H",
            "q_len",
            "batch_bucket",
            "bucket_lo",
            "bucket_hi",
            "weights_digest",
            name="uq_graph_plan_key",
        ),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    kernel_id: Mapped[int] = mapped_column(ForeignKey("kernels.id"))
    dtype: Mapped[str] = mapped_column(String(16))
    H: Mapped[int]
    q_len: Mapped[int]
    batch_bucket: Mapped[int]
    bucket_lo: Mapped[int]  # prefix bucket indices of the range, both inclusive
    bucket_hi: Mapped[int]
    weights_digest: Mapped[str] = mapped_column(String(64))
    #: {"source", "outside", "buckets": {index: weight}}
    weights: Mapped[dict[str, Any]]
    #: the chosen config's constants (PARAM_NAMES)
    params: Mapped[dict[str, Any]]
    expected_us: Mapped[float] = mapped_column(Float)
    #: [{"bucket", "prefix", "weight", "us", "p10_us", "p90_us", "best_us", "regret", "best"}] by bucket
    per_bucket: Mapped[list[Any]] = mapped_column(JSON)
    #: [{"params", "expected_us" (None: failed somewhere), "failed_at"}]: what it was chosen from
    finalists: Mapped[list[Any]] = mapped_column(JSON)
    batch: Mapped[int]  # the batch size measured (its lookup prefix: each bucket's)
    spread: Mapped[str] = mapped_column(String(16))
    rounds: Mapped[int]
    measured_by: Mapped[str] = mapped_column(Text)  # device, driver, CUDA
    measured_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    neighbour_mb: Mapped[int] = timing_column()


class Verification(Base):
    """One re-timing of a stored best against the heuristic by `tuner configs verify`, kept whatever
    the verdict (nothing is deleted; migration 0004). Keyed like best_configs, not by its id: the
    history outlives the row."""

    __tablename__ = "best_verifications"
    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"), index=True)
    kernel_id: Mapped[int] = mapped_column(ForeignKey("kernels.id"))
    dtype: Mapped[str] = mapped_column(String(16))
    H: Mapped[int]
    q_len: Mapped[int]
    bucket: Mapped[int]
    batch_bucket: Mapped[int]
    params: Mapped[dict[str, Any]]  # the stored config verified
    stored_us: Mapped[float | None] = mapped_column(Float)  # its time when it was stored
    measured_us: Mapped[float | None] = mapped_column(Float)
    measured_p10_us: Mapped[float | None] = mapped_column(Float)
    measured_p90_us: Mapped[float | None] = mapped_column(Float)
    heuristic_params: Mapped[dict[str, Any]]
    heuristic_us: Mapped[float | None] = mapped_column(Float)
    heuristic_p10_us: Mapped[float | None] = mapped_column(Float)
    heuristic_p90_us: Mapped[float | None] = mapped_column(Float)
    noise: Mapped[float | None] = mapped_column(Float)  # the relative threshold the verdict used
    #: ok | moved | stale | failed
    verdict: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    measured_by: Mapped[str] = mapped_column(Text)
    verified_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    neighbour_mb: Mapped[int] = timing_column()


class DataVersion(Base):
    """One row (id 1): bumped in the same transaction as every write of best configs or devices,
    so the sidecar's cache stamp changes on every write (migration 0002 says why)."""

    __tablename__ = "data_version"
    id: Mapped[int] = mapped_column(primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger)
