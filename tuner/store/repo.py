"""Queries, keyword-only, each taking the session. The API and CLI call these, never raw SQL."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session
from verify_tuner import buckets
from verify_tuner.errors import StorageError
from verify_tuner.kernels.build import KERNEL_NAME, KERNEL_VERSION
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.keys import ConfigKey
from verify_tuner.store.models import (
    BestConfig,
    DataVersion,
    Device,
    Kernel,
    Study,
    Trial,
    utcnow,
)


@dataclass(frozen=True)
class BestRow:
    """A stored best config with its key, detached from the session."""

    key: ConfigKey
    config: KernelConfig
    median_us: float | None
    p10_us: float | None
    p90_us: float | None
    default_us: float | None
    speedup: float | None
    study_id: int | None
    tuned_at: dt.datetime | None
    #: the latest `tuner configs verify` verdict since it was stored (None: none): a "stale" row is not served
    verdict: str | None = None
    verified_at: dt.datetime | None = None

    @property
    def stale(self) -> bool:
        return self.verdict == "stale"


def _insert(session: Session, model: type, row: dict[str, Any]):  # type: ignore[no-untyped-def]
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    elif dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert  # type: ignore[assignment]
    else:
        raise StorageError(f"unsupported database dialect {dialect!r}")
    return insert(model).values(**row)


def _upsert(session: Session, model: type, *, key_cols: dict[str, Any], values: dict[str, Any]) -> None:
    """INSERT ... ON CONFLICT DO UPDATE, portable across SQLite and PostgreSQL: concurrent writers
    of one key never fail and never lose a committed row."""
    stmt = _insert(session, model, {**key_cols, **values})
    session.execute(stmt.on_conflict_do_update(index_elements=list(key_cols), set_=values))


def _insert_ignore(session: Session, model: type, *, key_cols: dict[str, Any], values: dict[str, Any]) -> None:
    stmt = _insert(session, model, {**key_cols, **values})
    session.execute(stmt.on_conflict_do_nothing(index_elements=list(key_cols)))


# --- devices and kernels ---------------------------------------------------------------------
def upsert_device(*, session: Session, limits: DeviceLimits) -> Device:
    values = {
        "compute_capability": limits.compute_capability,
        "sm_count": limits.sm_count,
        "max_smem_optin": limits.max_smem_optin,
        "smem_per_sm": limits.smem_per_sm,
        "regs_per_sm": limits.regs_per_sm,
        "regs_per_block": limits.regs_per_block,
        "max_threads_per_block": limits.max_threads_per_block,
        "l2_bytes": limits.l2_bytes,
        "driver_version": limits.driver_version,
        "cuda_version": limits.cuda_version,
        "recorded_at": utcnow(),
    }
    if limits.copy_bw_gbps is not None:  # a known-table record must not erase a measured figure
        values["copy_bw_gbps"] = limits.copy_bw_gbps
    _bump_version(session)
    _upsert(session, Device, key_cols={"name": limits.name}, values=values)
    return session.scalars(select(Device).where(Device.name == limits.name)).one()


def _bump_version(session: Session) -> None:
    """Every write of best configs or devices calls this in its own transaction, before its
    other writes: the sidecar's cache stamp (data_stamp) then changes with every write, whatever
    the rows' timestamps, and every writer takes this row's lock first (one lock order: writers
    on PostgreSQL queue instead of deadlocking)."""
    if (
        session.execute(update(DataVersion).where(DataVersion.id == 1).values(version=DataVersion.version + 1)).rowcount
        == 0
    ):
        raise StorageError("the data_version row is missing: run `tuner db upgrade`")


def get_device(*, session: Session, name: str) -> Device | None:
    return session.scalars(select(Device).where(Device.name == name)).one_or_none()


def list_devices(*, session: Session) -> list[Device]:
    return list(session.scalars(select(Device).order_by(Device.name)))


def device_limits(device: Device) -> DeviceLimits:
    major, minor = (int(x) for x in device.compute_capability.split("."))
    return DeviceLimits(
        name=device.name,
        cc_major=major,
        cc_minor=minor,
        sm_count=device.sm_count,
        max_smem_optin=device.max_smem_optin,
        smem_per_sm=device.smem_per_sm,
        regs_per_sm=device.regs_per_sm,
        regs_per_block=device.regs_per_block,
        max_threads_per_block=device.max_threads_per_block,
        l2_bytes=device.l2_bytes,
        driver_version=device.driver_version,
        cuda_version=device.cuda_version,
        copy_bw_gbps=device.copy_bw_gbps,
    )


def upsert_kernel(*, session: Session, source_hash: str, name: str, version: str) -> Kernel:
    """The kernel row of `source_hash`, inserted on first use. An existing row is not rewritten
    (its name and version come from the same source): a rewrite would lock the row, and two
    tuners storing winners then deadlock against each other's data_version bump."""
    _insert_ignore(session, Kernel, key_cols={"source_hash": source_hash}, values={"name": name, "version": version})
    return session.scalars(select(Kernel).where(Kernel.source_hash == source_hash)).one()


# --- best configs ----------------------------------------------------------------------------
def _best_query(**filters: object):  # type: ignore[no-untyped-def]
    """Best configs joined with their device name and kernel hash; None filters are ignored."""
    cols = {
        "device": Device.name,
        "kernel_hash": Kernel.source_hash,
        "dtype": BestConfig.dtype,
        "H": BestConfig.H,
        "q_len": BestConfig.q_len,
        "bucket": BestConfig.bucket,
        "batch_bucket": BestConfig.batch_bucket,
    }
    q = (
        select(BestConfig, Device.name, Kernel.source_hash)
        .join(Device, BestConfig.device_id == Device.id)
        .join(Kernel, BestConfig.kernel_id == Kernel.id)
    )
    for name, value in filters.items():
        if value is not None:
            q = q.where(cols[name] == value)
    return q.order_by(Device.name, BestConfig.H, BestConfig.q_len, BestConfig.batch_bucket, BestConfig.bucket)


def _to_row(best: BestConfig, device: str, kernel_hash: str) -> BestRow:
    cfg = KernelConfig.from_params(
        {"NSPLIT": best.nsplit, "HT": best.ht, "TK": best.tk, "BLOCK": best.block, **(best.extra or {})}
    )
    key = ConfigKey(device, kernel_hash, best.dtype, best.H, best.q_len, best.bucket, best.batch_bucket)
    return BestRow(
        key,
        cfg,
        best.median_us,
        best.p10_us,
        best.p90_us,
        best.default_us,
        best.speedup,
        best.study_id,
        best.tuned_at,
        best.verdict,
        best.verified_at,
    )


def get_best(*, session: Session, key: ConfigKey) -> BestRow | None:
    q = _best_query(
        device=key.device,
        kernel_hash=key.kernel_hash,
        dtype=key.dtype,
        H=key.H,
        q_len=key.q_len,
        bucket=key.bucket,
        batch_bucket=key.batch_bucket,
    )
    hit = session.execute(q).one_or_none()
    return _to_row(*hit) if hit else None


def list_best_for(
    *, session: Session, device: str, kernel_hash: str, dtype: str, H: int, q_len: int, batch_bucket: int | None = None
) -> list[BestRow]:
    """Stored bests of one (device, kernel, dtype, H, q_len); every batch bucket unless given."""
    q = _best_query(device=device, kernel_hash=kernel_hash, dtype=dtype, H=H, q_len=q_len, batch_bucket=batch_bucket)
    return [_to_row(*r) for r in session.execute(q)]


def nearest_row(rows: list[BestRow], target: buckets.Bucket) -> BestRow | None:
    """The row whose prefix bucket is closest to `target` in log distance (ties: the smaller
    bucket). The caller passes rows of one batch bucket: nearest never crosses batch buckets."""
    if not rows:
        return None
    return min(rows, key=lambda r: (buckets.log_distance(buckets.by_index(r.key.bucket), target), r.key.bucket))


def list_best(
    *, session: Session, device: str | None = None, H: int | None = None, q_len: int | None = None
) -> list[BestRow]:
    return [_to_row(*r) for r in session.execute(_best_query(device=device, H=H, q_len=q_len))]


def upsert_best(
    *,
    session: Session,
    key: ConfigKey,
    config: KernelConfig,
    median_us: float | None,
    p10_us: float | None = None,
    p90_us: float | None = None,
    default_us: float | None = None,
    study_id: int | None = None,
    tuned_at: dt.datetime | None = None,
    kernel_name: str = KERNEL_NAME,
    kernel_version: str = KERNEL_VERSION,
) -> None:
    """Store `config` as the best for `key`, replacing any existing row (the caller decides)."""
    device = get_device(session=session, name=key.device)
    if device is None:
        raise StorageError(f"device {key.device!r} is not recorded; record it first (tuner device record)")
    kernel = upsert_kernel(session=session, source_hash=key.kernel_hash, name=kernel_name, version=kernel_version)
    p = config.as_params()
    extra = config.extra_params()
    speedup = default_us / median_us if default_us and median_us else None
    values = {
        "nsplit": p["NSPLIT"],
        "ht": p["HT"],
        "tk": p["TK"],
        "block": p["BLOCK"],
        "extra": extra,
        "median_us": median_us,
        "p10_us": p10_us,
        "p90_us": p90_us,
        "default_us": default_us,
        "speedup": speedup,
        "study_id": study_id,
        "tuned_at": tuned_at or utcnow(),
        # storing the row again (a re-tune, an import) replaces what a verification said of the old one
        "verdict": None,
        "verified_at": None,
    }
    _bump_version(session)
    _upsert(
        session,
        BestConfig,
        key_cols=_key_columns(device.id, kernel.id, key),
        values=values,
    )


def _key_columns(device_id: int, kernel_id: int, key: ConfigKey) -> dict[str, Any]:
    """The columns a workload key fills in a table keyed by it (best configs, verifications)."""
    return {
        "device_id": device_id,
        "kernel_id": kernel_id,
        "dtype": key.dtype,
        "H": key.H,
        "q_len": key.q_len,
        "bucket": key.bucket,
        "batch_bucket": key.batch_bucket,
    }


def delete_best(
    *,
    session: Session,
    device: str,
    H: int | None = None,
    q_len: int | None = None,
    bucket: int | None = None,
    batch_bucket: int | None = None,
) -> int:
    dev = get_device(session=session, name=device)
    if dev is None:
        return 0
    _bump_version(session)  # first, like every writer (one lock order)
    stmt = delete(BestConfig).where(BestConfig.device_id == dev.id)
    if H is not None:
        stmt = stmt.where(BestConfig.H == H)
    if q_len is not None:
        stmt = stmt.where(BestConfig.q_len == q_len)
    if bucket is not None:
        stmt = stmt.where(BestConfig.bucket == bucket)
    if batch_bucket is not None:
        stmt = stmt.where(BestConfig.batch_bucket == batch_bucket)
    return session.execute(stmt).rowcount or 0


# --- studies and trials ----------------------------------------------------------------------
def get_or_create_study(
    *, session: Session, key: ConfigKey, prefix: int, sampler: str, seed: int | None, reopen: bool = True
) -> Study:
    """The study of `key`, created on first use; a finished one is reopened (resume) unless
    `reopen` is False (a look at its state)."""
    device = get_device(session=session, name=key.device)
    if device is None:
        raise StorageError(f"device {key.device!r} is not recorded")
    kernel = upsert_kernel(session=session, source_hash=key.kernel_hash, name=KERNEL_NAME, version=KERNEL_VERSION)
    _insert_ignore(
        session,
        Study,
        key_cols={"workload_key": str(key)},
        values={
            "device_id": device.id,
            "kernel_id": kernel.id,
            "dtype": key.dtype,
            "H": key.H,
            "q_len": key.q_len,
            "bucket": key.bucket,
            "batch_bucket": key.batch_bucket,
            "prefix": prefix,
            "status": "running",
            "sampler": sampler,
            "seed": seed,
            "started_at": utcnow(),
            "n_trials": 0,
            "n_ok": 0,
            "n_invalid": 0,
            "n_failed": 0,
        },
    )
    study = session.scalars(select(Study).where(Study.workload_key == str(key))).one()
    if reopen and study.status != "running":
        study.status, study.finished_at, study.sampler = "running", None, sampler
    return study


def find_study(*, session: Session, key: ConfigKey) -> Study | None:
    return session.scalars(select(Study).where(Study.workload_key == str(key))).one_or_none()


def claim_study(*, session: Session, study_id: int, owner: str, stale_before: dt.datetime) -> bool:
    """Make `owner` the process that picks and stores this study's winner, unless another owner
    beat after `stale_before` (one atomic UPDATE: two processes never both win a claim)."""
    stmt = (
        update(Study)
        .where(Study.id == study_id)
        .where((Study.owner.is_(None)) | (Study.owner == owner) | (Study.heartbeat_at < stale_before))
        .values(owner=owner, heartbeat_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return session.execute(stmt).rowcount == 1


def beat_study(*, session: Session, study_id: int, owner: str) -> bool:
    """Refresh the claim; False when another process has taken it over (we were stale)."""
    stmt = (
        update(Study)
        .where(Study.id == study_id, Study.owner == owner)
        .values(heartbeat_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return session.execute(stmt).rowcount == 1


def owners_of(*, session: Session, workload_keys: list[str]) -> dict[str, str | None]:
    """The owner of each of these keys' studies (None: unowned); keys with no study are left out."""
    rows = session.execute(select(Study.workload_key, Study.owner).where(Study.workload_key.in_(workload_keys)))
    return {k: o for k, o in rows}


def release_study(*, session: Session, study_id: int, owner: str) -> None:
    session.execute(
        update(Study)
        .where(Study.id == study_id, Study.owner == owner)
        .values(owner=None)
        .execution_options(synchronize_session=False)
    )


def record_trial(
    *,
    session: Session,
    study_id: int,
    params: dict[str, int],
    state: str,
    reason: str | None = None,
    median_us: float | None = None,
    p10_us: float | None = None,
    p90_us: float | None = None,
    samples: list[float] | None = None,
    rel_error: float | None = None,
) -> Trial:
    trial = Trial(
        study_id=study_id,
        params=params,
        state=state,
        reason=reason,
        median_us=median_us,
        p10_us=p10_us,
        p90_us=p90_us,
        samples=samples,
        rel_error=rel_error,
    )
    session.add(trial)
    # one atomic UPDATE (not read-modify-write in Python): processes sharing a study lose no count
    session.execute(
        update(Study)
        .where(Study.id == study_id)
        .values(
            n_trials=Study.n_trials + 1,
            n_ok=Study.n_ok + int(state == "ok"),
            n_invalid=Study.n_invalid + int(state == "invalid"),
            n_failed=Study.n_failed + int(state not in ("ok", "invalid")),
        )
    )
    return trial


def list_trials(*, session: Session, study_id: int) -> list[Trial]:
    return list(session.scalars(select(Trial).where(Trial.study_id == study_id).order_by(Trial.id)))


def finish_study(*, session: Session, study_id: int, status: str = "finished") -> None:
    study = session.get(Study, study_id)
    if study is not None:
        study.status, study.finished_at = status, utcnow()


class Stamp(NamedTuple):
    """What the sidecar's cache compares (a tuple: equal stamps, equal data), with the count of
    stale rows that /metrics reports."""

    version: int
    best: int
    devices: int
    plans: int
    stale: int


def data_stamp(*, session: Session) -> Stamp:
    """Changes with every write of best configs, graph plans, verdicts or devices (the data_version
    counter, bumped in the writer's transaction): the API's cache key."""
    from sqlalchemy import func
    from verify_tuner.store.models import GraphPlan

    # one round trip every re-check: the counts also notice rows removed behind the tuner's back,
    # and reading the tables notices a database that can no longer serve them
    row = session.execute(
        select(
            select(DataVersion.version).where(DataVersion.id == 1).scalar_subquery(),
            select(func.count(BestConfig.id)).scalar_subquery(),
            select(func.count(Device.id)).scalar_subquery(),
            select(func.count(GraphPlan.id)).scalar_subquery(),
            select(func.count(BestConfig.id)).where(BestConfig.verdict == "stale").scalar_subquery(),
        )
    ).one()
    return Stamp(*row)


def kernels_with_best(*, session: Session, device: str) -> list[str]:
    """Kernel hashes holding stored bests on `device`: the kernels a sidecar can answer for there."""
    q = (
        select(Kernel.source_hash)
        .join(BestConfig, BestConfig.kernel_id == Kernel.id)
        .join(Device, BestConfig.device_id == Device.id)
        .where(Device.name == device)
        .group_by(Kernel.source_hash)
        .order_by(Kernel.source_hash)
    )
    return list(session.scalars(q))
