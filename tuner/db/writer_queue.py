"""Writers to one SQLite file queue on a lock file instead of on SQLite's busy handler.

SQLite lets one connection write at a time; a writer that finds the file's write lock taken is
retried by the busy handler after 1, 2, 5, 10, 15, 20, 25, ... ms, so a wait for a transaction
that ends in half a millisecond costs one to eight. Tuner processes that share a job on one host
(`--devices 0,1`) write one SQLite file hundreds of times a second between them (Optuna's storage:
a commit per parameter, attribute, state and heartbeat), and those waits were where a key's
search got slower with two processes than with one (bench/results/multi_table, session 7: the
storage writes of the two-process run spent 3x the time of the one-process run inside SQLite).

A connection made by `connect` takes an exclusive `flock` on `<database>-writers` just before
the statement that starts its write transaction and releases it when the transaction ends, so
a waiting writer is woken when the lock is free. The lock orders writers; it guards nothing:
SQLite's own locking still does, so a writer that does not take it (another program, an older
tuner) only waits as it did before. A writer polls for the lock (50 us, doubling to 1 ms) for at
most the connection's busy timeout and then goes ahead without it, leaving the wait to SQLite:
a stuck holder makes others fail with SQLite's "database is locked", never hang.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from typing import Any

#: The statements that make a transaction a write (pysqlite begins it before the first DML; the
#: config database's engine begins with BEGIN IMMEDIATE; schema changes come from migrations).
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER", "BEGIN IMMEDIATE",
           "BEGIN EXCLUSIVE")


def lock_path(database: str) -> str:
    return f"{database}-writers"


class QueuedWriterConnection(sqlite3.Connection):
    """An sqlite3 connection whose write transactions queue on the database's lock file."""

    def __init__(self, database: str, *args: Any, timeout: float = 5.0, **kwargs: Any) -> None:
        super().__init__(database, *args, timeout=timeout, **kwargs)
        self._lock_fd = os.open(lock_path(os.fspath(database)), os.O_RDWR | os.O_CREAT, 0o644)
        self._max_wait_s = timeout
        self._held = False

    def cursor(self, factory: Any = None) -> sqlite3.Cursor:  # type: ignore[override]
        return super().cursor(factory or _QueuedCursor)

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:  # type: ignore[override]
        return self.cursor().execute(sql, parameters)  # the C shortcut would skip the cursor above

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> sqlite3.Cursor:  # type: ignore[override]
        return self.cursor().executemany(sql, seq_of_parameters)

    def _before(self, sql: str) -> None:
        if not self._held and sql.lstrip()[:15].upper().startswith(_WRITES):
            self._held = _take(self._lock_fd, self._max_wait_s)

    def _after(self) -> None:
        if self._held and not self.in_transaction:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            self._held = False

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            self._after()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self._after()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._drop_lock_file()

    def __del__(self) -> None:  # a connection dropped unclosed must not keep the lock file open
        self._drop_lock_file()

    def _drop_lock_file(self) -> None:
        if getattr(self, "_lock_fd", -1) >= 0:
            os.close(self._lock_fd)  # releases the lock with it
            self._lock_fd, self._held = -1, False


class _QueuedCursor(sqlite3.Cursor):
    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        conn: QueuedWriterConnection = self.connection  # type: ignore[assignment]
        conn._before(sql)
        try:
            return super().execute(sql, parameters)
        finally:
            conn._after()  # a statement that ended the transaction (COMMIT), or failed before it began

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> sqlite3.Cursor:
        conn: QueuedWriterConnection = self.connection  # type: ignore[assignment]
        conn._before(sql)
        try:
            return super().executemany(sql, seq_of_parameters)
        finally:
            conn._after()


def _take(fd: int, max_wait_s: float) -> bool:
    """The lock, polled for at most `max_wait_s`; False (go ahead without it) after that."""
    deadline = time.monotonic() + max_wait_s
    pause = 50e-6
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
