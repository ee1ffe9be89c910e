"""Queries of best configs, keyword-only, each taking the session: a workload key's stored
winner, read, written and deleted. The API and CLI call these, never raw SQL."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session
from verify_tuner import buckets
from verify_tuner.kernels.build import KERNEL_NAME, KERNEL_VERSION
from verify_tuner.kernels.config import CORE_PARAMS, KernelConfig
from verify_tuner.keys import ConfigKey
from verify_tuner.store.data_version import bump_version
from verify_tuner.store.devices import get_device, key_ids
from verify_tuner.store.models import BestConfig, Device, Kernel, utcnow
from verify_tuner.store.writes import key_columns, upsert, upsert_many


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
    #: how its times were measured (0: back to back; verify_tuner.measure.backend.Workload.neighbour_mb)
    neighbour_mb: int = 0

    @property
    def stale(self) -> bool:
        return self.verdict == "stale"


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


def to_best_row(best: BestConfig, device: str, kernel_hash: str) -> BestRow:
    """The detached row of a best config, from its table row with its device name and kernel hash."""
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
        best.neighbour_mb,
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
    return to_best_row(*hit) if hit else None


def list_best_for(
    *, session: Session, device: str, kernel_hash: str, dtype: str, H: int, q_len: int, batch_bucket: int | None = None
) -> list[BestRow]:
    """Stored bests of one (device, kernel, dtype, H, q_len); every batch bucket unless given."""
    q = _best_query(device=device, kernel_hash=kernel_hash, dtype=dtype, H=H, q_len=q_len, batch_bucket=batch_bucket)
    return [to_best_row(*r) for r in session.execute(q)]


def nearest_row(rows: list[BestRow], target: buckets.Bucket) -> BestRow | None:
    """The row whose prefix bucket is closest to `target` in log distance (ties: the smaller
    bucket). The caller passes rows of one batch bucket: nearest never crosses batch buckets."""
    if not rows:
        return None
    return min(rows, key=lambda r: (buckets.log_distance(buckets.by_index(r.key.bucket), target), r.key.bucket))


def list_best(
    *, session: Session, device: str | None = None, H: int | None = None, q_len: int | None = None
) -> list[BestRow]:
    return [to_best_row(*r) for r in session.execute(_best_query(device=device, H=H, q_len=q_len))]


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
    verdict: str | None = None,
    verified_at: dt.datetime | None = None,
    neighbour_mb: int = 0,
) -> None:
    """Store `config` as the best for `key`, replacing any existing row (the caller decides); the
    verdict is the imported row's own (an export carries it), else none."""
    device_id, kernel_id = key_ids(
        session=session,
        device=key.device,
        kernel_hash=key.kernel_hash,
        kernel_name=kernel_name,
        kernel_version=kernel_version,
    )
    row = BestRow(
        key, config, median_us, p10_us, p90_us, default_us, None, study_id, tuned_at, verdict, verified_at, neighbour_mb
    )
    bump_version(session)
    upsert(session, BestConfig, key_cols=key_columns(device_id, kernel_id, key), values=_values(row))


def upsert_bests(*, session: Session, rows: list[BestRow]) -> None:
    """`upsert_best` of many rows (an import) in one statement, with one data_version bump and one
    lookup of each (device, kernel); each row's speedup is derived from its times, as there. The
    caller gives distinct keys, of recorded devices."""
    if not rows:
        return
    bump_version(session)
    ids: dict[tuple[str, str], tuple[int, int]] = {}
    params = []
    for r in rows:
        where = (r.key.device, r.key.kernel_hash)
        if where not in ids:
            ids[where] = key_ids(session=session, device=where[0], kernel_hash=where[1])
        params.append({**key_columns(*ids[where], r.key), **_values(r)})
    upsert_many(session, BestConfig, key_names=list(key_columns(0, 0, rows[0].key)), rows=params)


def _values(row: BestRow) -> dict[str, Any]:
    """A best config's stored columns but its key's; `row.speedup` is ignored (derived here)."""
    p = row.config.as_params()
    return {
        "nsplit": p["NSPLIT"],
        "ht": p["HT"],
        "tk": p["TK"],
        "block": p["BLOCK"],
        "extra": {k: v for k, v in p.items() if k not in CORE_PARAMS},  # config.extra_params(), without a 2nd asdict
        "median_us": row.median_us,
        "p10_us": row.p10_us,
        "p90_us": row.p90_us,
        "default_us": row.default_us,
        "speedup": row.default_us / row.median_us if row.default_us and row.median_us else None,
        "study_id": row.study_id,
        "tuned_at": row.tuned_at or utcnow(),
        # storing the row again (a re-tune, an import) replaces what a verification said of the old one
        "verdict": row.verdict,
        "verified_at": row.verified_at,
        "neighbour_mb": row.neighbour_mb,
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
    bump_version(session)  # first, like every writer (one lock order)
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
