"""Queries of best configs, keyword-only, each taking the session: a workload key's stored
winner, read, written and deleted. The API and CLI call these, never raw SQL."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select
from sqlalchemy.orm import Session
from verify_tuner import buckets
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.keys import ConfigKey, TableKey
from verify_tuner.store import keyed
from verify_tuner.store.data_version import bump_version
from verify_tuner.store.devices import key_ids
from verify_tuner.store.models import BestConfig, Device, Kernel, utcnow
from verify_tuner.store.writes import upsert, upsert_many


@dataclass(frozen=True)
class BestRow:
    """A best config with its key and times, as stored (upsert_best) and read back, detached from
    the session."""

    key: ConfigKey
    config: KernelConfig
    median_us: float | None
    p10_us: float | None = None
    p90_us: float | None = None
    default_us: float | None = None
    study_id: int | None = None
    tuned_at: dt.datetime | None = None  # None when storing: now
    #: the latest `tuner configs verify` verdict since it was stored (None: none): a "stale" row is not
    #: served. An imported row keeps its own (an export carries it); a re-tune stores none.
    verdict: str | None = None
    verified_at: dt.datetime | None = None
    #: how its times were measured (0: back to back; verify_tuner.measure.backend.Workload.neighbour_mb)
    neighbour_mb: int = 0

    @property
    def stale(self) -> bool:
        return self.verdict == "stale"

    @property
    def speedup(self) -> float | None:
        """Over the heuristic default, timed beside it."""
        return self.default_us / self.median_us if self.default_us and self.median_us else None


#: What a best's table row and its BestRow hold under the same name.
_ROW_FIELDS = ("median_us", "p10_us", "p90_us", "default_us", "study_id", "tuned_at", "verdict", "verified_at")


def _select(**filters: object) -> Select[Any]:
    """Best configs with their device name and kernel hash, where each key field given has that value."""
    order = keyed.columns(BestConfig, "H", "q_len", "batch_bucket", "bucket")
    return keyed.select_keyed(BestConfig, **filters).order_by(Device.name, *order)


def to_best_row(best: BestConfig, device: str, kernel_hash: str) -> BestRow:
    """The detached row of a best config, from its table row with its device name and kernel hash."""
    cfg = KernelConfig.from_params(
        {"NSPLIT": best.nsplit, "HT": best.ht, "TK": best.tk, "BLOCK": best.block, **(best.extra or {})}
    )
    key = keyed.row_key(best, device, kernel_hash, ConfigKey)
    fields = {name: getattr(best, name) for name in _ROW_FIELDS}
    return BestRow(key, cfg, **fields, neighbour_mb=best.neighbour_mb)


def get_best(*, session: Session, key: ConfigKey) -> BestRow | None:
    hit = session.execute(_select(**key.values())).one_or_none()
    return to_best_row(*hit) if hit else None


def list_best_for(*, session: Session, table: TableKey, batch_bucket: int | None = None) -> list[BestRow]:
    """Stored bests of one answer table; every batch bucket unless given."""
    return [to_best_row(*r) for r in session.execute(_select(**table.table.values(), batch_bucket=batch_bucket))]


def nearest_row(rows: list[BestRow], target: buckets.Bucket) -> BestRow | None:
    """The row whose prefix bucket is closest to `target` in log distance (ties: the smaller
    bucket). The caller passes rows of one batch bucket: nearest never crosses batch buckets."""
    if not rows:
        return None
    return min(rows, key=lambda r: (buckets.log_distance(buckets.by_index(r.key.bucket), target), r.key.bucket))


def list_best(*, session: Session, **filters: object) -> list[BestRow]:
    """Stored bests whose key fields have the values given (device, H, q_len, kv_dtype, ...; None: any)."""
    return [to_best_row(*r) for r in session.execute(_select(**filters))]


def upsert_best(*, session: Session, row: BestRow) -> None:
    """Store `row`, replacing the row of its key (the caller decides). Its tuned_at defaults to now."""
    device_id, kernel_id = key_ids(session=session, device=row.key.device, kernel_hash=row.key.kernel_hash)
    bump_version(session)
    upsert(session, BestConfig, key_cols=keyed.key_columns(device_id, kernel_id, row.key), values=_values(row))


def upsert_bests(*, session: Session, rows: list[BestRow]) -> None:
    """`upsert_best` of many rows (an import) in one statement, with one data_version bump and one
    lookup of each (device, kernel). The caller gives distinct keys, of recorded devices."""
    if not rows:
        return
    bump_version(session)
    ids: dict[tuple[str, str], tuple[int, int]] = {}
    params = []
    for r in rows:
        where = (r.key.device, r.key.kernel_hash)
        if where not in ids:
            ids[where] = key_ids(session=session, device=where[0], kernel_hash=where[1])
        params.append({**keyed.key_columns(*ids[where], r.key), **_values(r)})
    upsert_many(session, BestConfig, key_names=list(keyed.key_columns(0, 0, rows[0].key)), rows=params)


def _values(row: BestRow) -> dict[str, Any]:
    """A best config's stored columns but its key's: storing the row again (a re-tune, an import)
    replaces what a verification said of the old one with the row's own verdict."""
    p = row.config.as_params()
    return {
        "nsplit": p["NSPLIT"],
        "ht": p["HT"],
        "tk": p["TK"],
        "block": p["BLOCK"],
        "extra": row.config.extra_params(),
        **{name: getattr(row, name) for name in _ROW_FIELDS},
        "tuned_at": row.tuned_at or utcnow(),
        "speedup": row.speedup,
        "neighbour_mb": row.neighbour_mb,
    }


def delete_best(*, session: Session, device: str, **filters: int | str | None) -> int:
    """Delete the bests of `device` whose key fields have the values given (H, q_len, bucket, ...; None: any)."""
    return keyed.delete_keyed(session=session, model=BestConfig, device=device, filters=filters)


def kernels_with_best(*, session: Session, device: str) -> list[str]:
    """Kernel hashes holding stored bests on `device`: the kernels a sidecar can answer for there."""
    q = keyed.select_keyed(BestConfig, device=device).with_only_columns(Kernel.source_hash)
    return list(session.scalars(q.group_by(Kernel.source_hash).order_by(Kernel.source_hash)))
