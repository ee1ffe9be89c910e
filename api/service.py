"""Lookups behind the routes, with a cache that keeps serving the last good table when the
database fails (with the reason in a header) and never serves a table older than the database:
each request checks a cheap stamp of the best-config table first."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from kernels.limits import DeviceLimits
from tuner import buckets, lookup
from tuner.db import repo
from tuner.db.session import session_scope
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
    """Per-key tables, validated against the database by one background check every
    `recheck_s` (a single cheap query for all keys), so the request path does no I/O while
    nothing changed. Writes through this process's API clear it at once."""

    def __init__(self, max_entries: int = 4096, recheck_s: float = 0.1) -> None:
        self._lock = threading.Lock()
        self._tables: dict[tuple[object, ...], Table] = {}
        self.max_entries, self.recheck_s = max_entries, recheck_s
        self._stamp: tuple[object, ...] | None = None
        self._validated_at = 0.0

    def fresh(self, *, device: str | None, default_device: str | None, H: int, q_len: int,
              dtype: str) -> Table | None:
        """The cached table when the last background check (within 5 re-check periods) found the
        database unchanged; None sends the caller to `table` (threadpool, database)."""
        key = (device or default_device, H, q_len, dtype)
        with self._lock:
            hit = self._tables.get(key)
            if (hit is not None and hit.stale is None and hit.stamp == self._stamp
                    and time.monotonic() - self._validated_at < 5 * self.recheck_s):
                return hit
        return None

    def revalidate(self, sessions: sessionmaker[Session]) -> None:
        """The background check: read the stamp; on failure the request path takes over (and
        serves the last good table with the reason, or 503)."""
        try:
            with session_scope(sessions) as session:
                stamp = repo.data_stamp(session=session)
        except (SQLAlchemyError, StorageError):
            with self._lock:
                self._stamp = None
            return
        with self._lock:
            self._stamp, self._validated_at = stamp, time.monotonic()

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()
            self._stamp = None

    def table(self, *, sessions: sessionmaker[Session], device: str | None, default_device: str | None, H: int,
              q_len: int, dtype: str) -> Table:
        key = (device or default_device, H, q_len, dtype)
        try:
            with session_scope(sessions) as session:
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
            self._stamp, self._validated_at = stamp, time.monotonic()
        return table
