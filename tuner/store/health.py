"""Can the database be read and written right now, as a freshly started process would find it?
The sidecar's /readyz asks this; pooled connections would hide a file that was removed or made
read-only after they were opened."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from verify_tuner.errors import StorageError
from verify_tuner.store import data_version
from verify_tuner.store.migrate import ensure_current
from verify_tuner.store.session import make_engine, safe_url

PROBE_BUSY_TIMEOUT_MS = 1000  # a WAL reader never waits on writers; anything longer is a fault


@dataclass(frozen=True)
class DatabaseHealth:
    readable: bool
    writable: bool
    reason: str | None = None  # why not readable / not writable


def probe(url: str, *, read_only: bool = False, timeout_s: float | None = None) -> DatabaseHealth:
    parsed = make_url(url)
    sqlite_file = None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        sqlite_file = Path(parsed.database).expanduser()
        if not sqlite_file.exists():  # opening it would create an empty file: never do that here
            return DatabaseHealth(False, False, f"database file {sqlite_file} is missing")
    engine = make_engine(
        url,
        immediate=False,
        busy_timeout_ms=PROBE_BUSY_TIMEOUT_MS,
        pooled=False,
        read_only=read_only,
        timeout_s=timeout_s,
    )
    blocked: list[Path] = []
    if sqlite_file is not None:  # looked at before any read: SQLite may take over companions it can write
        # the file, and the directory its -wal/-shm/journal files live in, must be writable
        blocked = [p for p in (sqlite_file, sqlite_file.parent) if not os.access(p, os.W_OK)]
        blocked += unwritable_companions(sqlite_file)
    try:
        ensure_current(engine, safe_url(url))  # reads the schema version over a new connection
        read_only_server = _tables_usable(engine)
        if sqlite_file is not None:
            if blocked:
                return DatabaseHealth(
                    True, False, "database is read-only: cannot write " + ", ".join(str(p) for p in blocked)
                )
        elif read_only_server:
            return DatabaseHealth(True, False, "database is read-only (transaction_read_only = on)")
        return DatabaseHealth(True, True)
    except StorageError as exc:
        return DatabaseHealth(False, False, str(exc))
    except (SQLAlchemyError, OSError) as exc:  # a driver error on a fresh connection: not readable now
        return DatabaseHealth(False, False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    finally:
        engine.dispose()


def _tables_usable(engine: Engine) -> bool:
    """Read every table a lookup reads (data_stamp: one round trip), as the sidecar's requests will:
    a current schema version says nothing of a table renamed or dropped since (every uncached lookup
    was a 503 while /readyz said ready). On PostgreSQL, whether the server takes writes (a hot standby,
    default_transaction_read_only), in the same round trip's session: True when it does not."""
    with Session(engine) as session:
        data_version.data_stamp(session=session)
        if engine.dialect.name != "postgresql":
            return False
        return str(session.execute(text("SHOW transaction_read_only")).scalar()).lower() == "on"


def unwritable_companions(sqlite_file: Path) -> list[Path]:
    """The file's -wal, -shm or -journal that exist but that this user cannot write: SQLite made them
    for another user who opened the database (with the folder writable to it), and until they are
    gone every write here fails as "attempt to write a readonly database"."""
    out = []
    for suffix in ("-wal", "-shm", "-journal"):
        p = sqlite_file.with_name(sqlite_file.name + suffix)
        if p.exists() and not os.access(p, os.W_OK):
            out.append(p)
    return out
