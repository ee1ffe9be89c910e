"""Lookups behind the routes, with a cache that keeps serving the last good table when the
database fails (with the reason in a header) and never serves a table older than the database:
each request checks a cheap stamp of the best-config table first."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from kernels.limits import DeviceLimits
from tuner import buckets, lookup
from tuner.db import repo
from tuner.errors import StorageError


@dataclass(frozen=True)
class Table:
    stamp: tuple[object, ...]
    limits: DeviceLimits
    answers: list[lookup.Answer]
    stale: str | None = None  # why the database could not be read, when serving from cache

    def pick(self, prefix: int) -> lookup.Answer:
        return self.answers[buckets.bucket_of(prefix).index]


class TableCache:
    def __init__(self, max_entries: int = 4096) -> None:
        self._lock = threading.Lock()
        self._tables: dict[tuple[object, ...], Table] = {}
        self.max_entries = max_entries

    def table(self, *, session: Session, device: str | None, default_device: str | None, H: int, q_len: int,
              dtype: str) -> Table:
        key = (device or default_device, H, q_len, dtype)
        try:
            stamp = repo.data_stamp(session=session)
            with self._lock:
                hit = self._tables.get(key)
            if hit is not None and hit.stamp == stamp:
                return hit
            limits = lookup.resolve_device(session=session, name=device, default=default_device)
            answers = lookup.table(session=session, limits=limits, H=H, q_len=q_len, dtype=dtype)
        except (SQLAlchemyError, StorageError) as exc:
            with self._lock:
                hit = self._tables.get(key)
            if hit is None:
                raise StorageError(str(exc).splitlines()[0]) from exc
            return Table(hit.stamp, hit.limits, hit.answers, stale=str(exc).splitlines()[0][:300])
        table = Table(stamp, limits, answers)
        with self._lock:
            if len(self._tables) >= self.max_entries:
                self._tables.clear()
            self._tables[key] = table
        return table
