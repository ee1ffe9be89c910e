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
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedColumn, mapped_column
from verify_tuner import keys


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


#: The key fields a table holds as a reference to another table's row (the row of that name).
REFERENCES = {"device": ("device_id", "devices.id"), "kernel_hash": ("kernel_id", "kernels.id")}


def key_column_names(key_type: type[keys.TableKey] = keys.ConfigKey) -> list[str]:
    """The columns that hold a key's fields, in the key's order (device_id for the device, ...)."""
    return [REFERENCES[f.name][0] if f.name in REFERENCES else f.name for f, _ in keys.specs(key_type)]


def key_column(name: str, spec: keys.Spec, python_type: type) -> MappedColumn[Any]:
    """The column of one key field (a reference to the devices' or kernels' row for those two)."""
    if name in REFERENCES:
        return mapped_column(Integer, ForeignKey(REFERENCES[name][1]), nullable=False)
    # the value that rows stored before the field existed hold (a migration adds the column with it)
    default = None if spec.default is None else str(spec.default)
    return mapped_column(
        String(spec.max_len) if python_type is str else Integer, nullable=False, server_default=default
    )


class TableKeyColumns:
    """A column for each field of verify_tuner.keys.TableKey, made from the key's declaration."""


class KeyColumns(TableKeyColumns):
    """A column for each field of verify_tuner.keys.ConfigKey (the TableKey's, and the buckets)."""


def _add_key_columns() -> None:
    for mixin, key_type in ((TableKeyColumns, keys.TableKey), (KeyColumns, keys.ConfigKey)):
        types = keys.field_types(key_type)
        for (f, spec), column in zip(keys.specs(key_type), key_column_names(key_type)):
            if column not in vars(TableKeyColumns):
                setattr(mixin, column, key_column(f.name, spec, types[f.name]))


_add_key_columns()


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


class Study(KeyColumns, Base):
    __tablename__ = "tuning_studies"
    id: Mapped[int] = mapped_column(primary_key=True)
    workload_key: Mapped[str] = mapped_column(String(400), unique=True)
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


class BestConfig(KeyColumns, Base):
    __tablename__ = "best_configs"
    __table_args__ = (UniqueConstraint(*key_column_names(), name="uq_best_key"),)
    id: Mapped[int] = mapped_column(primary_key=True)
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


class GraphPlan(TableKeyColumns, Base):
    """One prefix range of a graph plan set (verify_tuner.search.graph_ranges): the config an engine
    captures for the batch sizes of one batch bucket and the prefixes of this range, with its time and
    regret at every prefix bucket of the range, all measured side by side in one call (migration
    0004). A set is the ranges chosen together from one measurement: keyed by the range measured
    (bucket_lo..bucket_hi) and the prefix weights' digest, each of its rows by where its own range
    starts (range_lo); a set of one range spans the whole measured range (migration 0007)."""

    __tablename__ = "graph_plans"
    __table_args__ = (
        UniqueConstraint(
            *key_column_names(keys.TableKey),
            "batch_bucket",
            "bucket_lo",
            "bucket_hi",
            "weights_digest",
            "range_lo",
            name="uq_graph_plan_key",
        ),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    #: a set spans prefix buckets (bucket_lo..bucket_hi) of one batch bucket: keyed by the table and those
    batch_bucket: Mapped[int]
    bucket_lo: Mapped[int]  # prefix bucket indices of the range measured, both inclusive
    bucket_hi: Mapped[int]
    weights_digest: Mapped[str] = mapped_column(String(64))
    #: this row's own range of prefix buckets, both inclusive, inside bucket_lo..bucket_hi
    range_lo: Mapped[int]
    range_hi: Mapped[int]
    #: {"source", "outside", "buckets": {index: weight}} (the whole measured range's)
    weights: Mapped[dict[str, Any]]
    #: the range's config's constants (PARAM_NAMES)
    params: Mapped[dict[str, Any]]
    #: the range's expected time, its weights renormalised to the range
    expected_us: Mapped[float] = mapped_column(Float)
    #: [{"bucket", "prefix", "weight", "us", "p10_us", "p90_us", "best_us", "regret", "best"}] by bucket
    per_bucket: Mapped[list[Any]] = mapped_column(JSON)
    #: [{"params", "expected_us" (None: failed somewhere), "failed_at"}]: what the set was chosen from
    finalists: Mapped[list[Any]] = mapped_column(JSON)
    batch: Mapped[int]  # the batch size measured (its lookup prefix: each bucket's)
    spread: Mapped[str] = mapped_column(String(16))
    rounds: Mapped[int]
    measured_by: Mapped[str] = mapped_column(Text)  # device, driver, CUDA
    measured_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    neighbour_mb: Mapped[int] = timing_column()
    #: how the set was chosen: at most this many ranges, a further one only where it saved min_saving
    max_graphs: Mapped[int] = mapped_column(default=1, server_default="1")
    min_saving: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    #: the set's expected step time with 1, 2, ... graphs (null: infinite, no such split; none stored before 0007)
    by_count: Mapped[list[Any] | None] = mapped_column(JSON)


class Verification(KeyColumns, Base):
    """One re-timing of a stored best against the heuristic by `tuner configs verify`, kept whatever
    the verdict (nothing is deleted; migration 0004). Keyed like best_configs, not by its id: the
    history outlives the row."""

    __tablename__ = "best_verifications"
    __table_args__ = (Index("ix_best_verifications_device_id", "device_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
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
