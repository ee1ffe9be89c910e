"""/readyz's answer, kept current by a thread instead of computed per request.

The readiness probe (verify_tuner.store.health: a new connection reads the schema version, then the
write checks) costs a few milliseconds alone, but ~300 ms under 200 clients flat out: its thread
gets the GIL only between the saturated event loop's turns. So one thread probes every `every_s`
and records the result; /readyz answers from the record at once, on whichever thread asks. The
facts a stat() can check (the SQLite file is at its path, is the file the record is about, and
it and its directory are writable) are checked live on each answer; the database's own answer
is at most `every_s` + the probe's duration old. A probe running past `timeout_s` (a hung
database) is not-ready at once, and a record older than `every_s + timeout_s` (the thread itself
stalled) is not-ready too: /readyz never says ready on an answer it cannot vouch for.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from verify_tuner.api.public import client_reason
from verify_tuner.settings import Settings
from verify_tuner.store.health import DatabaseHealth, probe, unwritable_companions

#: Seconds between the ends of two probes: a database that fails is seen within this (plus a probe).
EVERY_S = 0.5

log = logging.getLogger(__name__)

Identity = tuple[int, int] | None  # an SQLite file's (st_dev, st_ino); None: no file at the path


@dataclass(frozen=True)
class Reading:
    health: DatabaseHealth
    finished: float  # on the readiness clock
    identity: Identity  # of the SQLite file when the probe began


class Readiness:
    def __init__(
        self,
        settings: Settings,
        *,
        every_s: float = EVERY_S,
        probe_fn: Callable[..., DatabaseHealth] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self.every_s, self.timeout_s = settings, every_s, settings.db_timeout_s
        self._probe, self._clock = probe_fn or probe, clock
        url = make_url(settings.database_url)
        is_file = url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:")
        self.path = Path(url.database).expanduser() if is_file else None  # type: ignore[arg-type]
        self._lock = threading.Lock()
        self._reading: Reading | None = None
        self._was_ready: bool | None = None  # as last logged
        self._probing_since: float | None = None
        self._wake, self._stop, self._first = threading.Event(), threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="tuner-readiness", daemon=True)

    @property
    def bound_s(self) -> float:
        """The oldest record answered from while no probe runs (while one does, its deadline rules)."""
        return self.every_s + self.timeout_s

    def start(self) -> None:
        """Start probing; return after the first probe (or its deadline), so /readyz is meaningful
        from the first request."""
        self._thread.start()
        self._first.wait(self.timeout_s)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=1.0)  # a probe hung on the database is left to its driver's timeout

    def _run(self) -> None:
        while not self._stop.is_set():
            identity, started = self._identity(), self._clock()
            with self._lock:
                self._probing_since = started
            try:
                health = self._probe(
                    self.settings.database_url, read_only=self.settings.database_read_only, timeout_s=self.timeout_s
                )
            except Exception as exc:  # a bug here must not end the checks: the record would only age
                log.exception("readiness probe failed")
                health = DatabaseHealth(False, False, f"readiness probe failed: {type(exc).__name__}")
            finished = self._clock()
            if finished - started > self.timeout_s:  # an answer past the deadline is no answer
                health = DatabaseHealth(False, False, self._late(health.reason))
            with self._lock:
                self._reading, self._probing_since = Reading(health, finished, identity), None
            self._log_change(health)
            self._first.set()
            self._wake.wait(self.every_s)
            self._wake.clear()

    def _late(self, reason: str | None) -> str:
        return f"the database did not answer within {self.timeout_s:g} s" + (f" ({reason})" if reason else "")

    def _identity(self) -> Identity:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def health(self) -> DatabaseHealth:
        """The database's readiness now, without waiting on it: a few stat() calls at most."""
        now = self._clock()
        with self._lock:
            reading, since = self._reading, self._probing_since
        identity = self._identity()
        if self.path is not None and identity is None:
            return DatabaseHealth(False, False, f"database file {self.path} is missing")
        if since is not None and now - since > self.timeout_s:
            return DatabaseHealth(False, False, self._late(f"a probe has been waiting {now - since:.1f} s"))
        if reading is None:
            return DatabaseHealth(False, False, "readiness not checked yet")
        if since is None and now - reading.finished > self.bound_s:  # the thread did not start the next probe
            return DatabaseHealth(False, False, f"readiness last checked {now - reading.finished:.1f} s ago")
        if identity != reading.identity:  # the record is about the file that was there before
            self._wake.set()
            return DatabaseHealth(False, False, f"database file {self.path} was replaced: re-checking it")
        if self.path is None or not reading.health.readable:
            return reading.health
        # on SQLite, writable is a property of the file, its directory and its -wal/-shm/-journal:
        # checked now, not 0.5 s ago (the probe checks the same; an immutable -wal was once missed here)
        blocked = [p for p in (self.path, self.path.parent) if not os.access(p, os.W_OK)]
        blocked += unwritable_companions(self.path)
        if blocked:
            return DatabaseHealth(True, False, "database is read-only: cannot write " + ", ".join(map(str, blocked)))
        return DatabaseHealth(True, True)

    def answer(self) -> tuple[int, dict[str, Any]]:
        """/readyz's status and body: ready when the database can be read and, unless it is declared
        read-only (TUNER_DATABASE_READ_ONLY), written."""
        health, read_only = self.health(), self.settings.database_read_only
        db = {"readable": health.readable, "writable": health.writable, "read_only_expected": read_only}
        # unauthenticated on both ports: a phrase, not the path or URL (the log has the detail)
        reason = client_reason(health.reason) if health.reason else None
        if health.readable and (health.writable or read_only):
            return 200, {"status": "ready", "database": db} | ({"note": reason} if reason else {})
        return 503, {"status": "unavailable", "reason": reason, "database": db}

    def _log_change(self, health: DatabaseHealth) -> None:
        """One log line when readiness turns, with the detail /readyz does not show."""
        ready = health.readable and (health.writable or self.settings.database_read_only)
        if ready == self._was_ready:
            return
        self._was_ready = ready
        if ready:
            log.info("ready: the database can be read%s", "" if self.settings.database_read_only else " and written")
        else:
            log.warning("not ready: %s", health.reason)
