"""Engines and the one session scope that owns commit/rollback."""

from __future__ import annotations

import contextlib
import logging
import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry, NullPool
from verify_tuner.errors import StorageError

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000
#: A PostgreSQL that accepts a connection and never answers would otherwise hang every command for good.
CONNECT_TIMEOUT_S = 10


def make_engine(
    url: str,
    *,
    immediate: bool = True,
    busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
    pooled: bool = True,
    read_only: bool = False,
    foreign_keys: bool = True,
    timeout_s: float | None = None,
    create: bool = True,
    wal: bool = False,
    setting: str = "TUNER_DATABASE_URL",
) -> Engine:
    """An engine; SQLite gets a busy timeout, WAL once a connection has written (or at connect with
    `wal`: what creates the file), and, for writers (`immediate`), transactions that take the
    write lock up front. Read-only users pass immediate=False so that they never
    queue behind writers (WAL readers need no lock). `pooled=False` opens a new connection per
    use: what a probe needs to see the database as a restarted process would. `read_only` opens
    an SQLite file read-only and leaves its journal mode alone (a read-only file cannot switch
    to WAL; one already in WAL needs its -wal/-shm beside it). `foreign_keys=False` is for
    migrations only: SQLite alters a table by copying it, and dropping the old copy with foreign
    keys on would cascade into the rows that point at it. `timeout_s` (the sidecar's) bounds, on
    PostgreSQL, the connect, each statement (server side) and the wait for a pooled connection;
    without it only the connect is bounded (CONNECT_TIMEOUT_S). `create=False` never creates a
    missing SQLite file (the sidecar's: a file deleted under it must not come back empty);
    `setting` is the variable an unwritable file is blamed on (check_writable). The
    journal mode is stored in the file, so a connection that only reads never sets it: reading a
    snapshot (rollback-journal mode, bound for a read-only mount) must leave it as it was."""
    check_url(url)
    parsed = make_url(url)
    pool: dict[str, Any] = {} if pooled else {"poolclass": NullPool}
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, **pool, **_postgres_timeouts(timeout_s, pooled))
    url = _sqlite_url(parsed, read_only=read_only, create=create, setting=setting)
    engine = create_engine(url, connect_args={"timeout": busy_timeout_ms / 1000}, **pool)
    _sqlite_listeners(
        engine,
        immediate=immediate,
        busy_timeout_ms=busy_timeout_ms,
        read_only=read_only,
        foreign_keys=foreign_keys,
        wal=wal,
    )
    return engine


def _sqlite_url(parsed: URL, *, read_only: bool, create: bool, setting: str) -> str:
    """The URL an SQLite engine opens: a file opened read-only, or never created, through a URI that
    says so; a file's `~` expanded (the file the checks look at, not a `~` folder under the cwd)."""
    if not parsed.database or parsed.database == ":memory:":
        return parsed.render_as_string(hide_password=False)
    if not read_only:
        check_writable(Path(parsed.database).expanduser(), setting)
    if read_only or not create:
        path = Path(parsed.database).expanduser().resolve()
        return f"sqlite:///file:{quote(str(path))}?mode={'ro' if read_only else 'rw'}&uri=true"
    return parsed.set(database=str(Path(parsed.database).expanduser())).render_as_string(hide_password=False)


def _sqlite_listeners(
    engine: Engine, *, immediate: bool, busy_timeout_ms: int, read_only: bool, foreign_keys: bool, wal: bool
) -> None:
    """Each new SQLite connection's pragmas (the busy timeout, foreign keys, WAL with `wal`), its
    BEGIN (IMMEDIATE for writers), and WAL once it has written (never when read-only)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, record: ConnectionPoolEntry) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves, below
        cur = dbapi_conn.cursor()
        if wal and not read_only:
            cur.execute("PRAGMA journal_mode=WAL")
            record.info["wal"] = True
        cur.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        cur.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
        cur.close()

    if not read_only:

        @event.listens_for(engine, "checkin")
        def _wal_once_written(dbapi_conn: sqlite3.Connection, record: ConnectionPoolEntry) -> None:
            # back in the pool no transaction is open (the mode cannot change inside one); the first
            # write ran in the file's old mode, every later one in WAL, where readers never wait on it
            if dbapi_conn is None or record.info.get("wal") or not dbapi_conn.total_changes:
                return
            try:
                dbapi_conn.execute("PRAGMA journal_mode=WAL")
                record.info["wal"] = True
            except sqlite3.Error as exc:  # the write is committed: a later one retries the switch
                log.warning("could not switch %s to WAL: %s", engine.url, exc)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # IMMEDIATE takes the write lock at BEGIN: concurrent writers wait on the busy timeout
        # instead of failing with "database is locked" when a read lock cannot be upgraded.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _postgres_timeouts(timeout_s: float | None, pooled: bool) -> dict[str, Any]:
    """libpq's connect_timeout (whole seconds; psycopg raises 2 s minimum), PostgreSQL's
    statement_timeout, SQLAlchemy's pool checkout timeout."""
    if timeout_s is None:
        return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    args: dict[str, Any] = {
        "connect_args": {
            "connect_timeout": max(2, math.ceil(timeout_s)),
            "options": f"-c statement_timeout={int(timeout_s * 1000)}",
        }
    }
    if pooled:
        args["pool_timeout"] = timeout_s
    return args


def safe_url(url: str) -> str:
    """The URL as an operator may read it: without its password."""
    return make_url(url).render_as_string(hide_password=True)


def error_line(exc: SQLAlchemyError) -> str:
    """A database error's first line, the driver's own (without SQLAlchemy's statement and link)."""
    orig = getattr(exc, "orig", None)
    return str(orig if orig is not None else exc).strip().splitlines()[0]


def check_url(url: str) -> None:
    """StorageError naming the URL (without its password) when url_error finds it cannot be opened."""
    if why := url_error(url):
        raise StorageError(f"database URL {safe_url(url)}: {why}")


def url_error(url: str) -> str | None:
    """Why this project cannot open the (well-formed) database `url`, or None: a backend other than
    SQLite and PostgreSQL, or a driver that is not installed (checked before SQLAlchemy fails on it)."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        return f"{backend!r} is not supported: use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
    try:
        parsed.get_dialect().import_dbapi()
    except NoSuchModuleError:
        return f"unknown driver {parsed.drivername!r}: use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
    except ModuleNotFoundError as exc:
        fix = (
            "pip install 'verify-tuner[postgres]' (for a postgresql+psycopg:// URL)" if backend == "postgresql" else ""
        )
        return f"{parsed.drivername} needs the {exc.name} package, which is not installed" + (f": {fix}" if fix else "")
    try:  # the URL's query parameters as the driver will take them (sqlite's timeout=abc raised at connect)
        parsed.get_dialect()().create_connect_args(parsed)
    except (ValueError, TypeError) as exc:
        return f"a parameter of the URL is not valid: {exc}"
    return None


def check_writable(path: Path, setting: str = "TUNER_DATABASE_URL") -> None:
    """A database this process could not create or write fails here with the fix, instead of as
    SQLite's bare "unable to open database file" at the first query (the classic case: a
    container's non-root user on a fresh root-owned volume). `setting`: the variable that named
    the file (the study storage's is TUNER_STUDY_STORAGE), so the message blames the right one."""
    import os
    import threading

    what = "the study storage" if setting == "TUNER_STUDY_STORAGE" else "the database"
    directory = path.parent
    if blocker := _file_in_the_way(directory):  # mkdir said only "(File exists)" or "(Not a directory)"
        raise StorageError(
            f"cannot create {path} for {what}: {blocker} is a file, not a folder: set {setting} to a path in a folder"
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(
            f"cannot create {directory} for {what} ({exc.strerror}): set {setting} "
            "to a writable path, or create that directory for this user"
        ) from None
    if not path.exists() and not os.access(directory, os.W_OK | os.X_OK):
        st = directory.stat()
        # the owner's own folder without write permission needs chmod, not the chown that fixes a volume
        fix = (
            f"`chmod u+wx {directory}`"
            if st.st_uid == os.getuid()
            else f"mount a volume this user can write (e.g. `chown {os.getuid()} {directory}`)"
        )
        raise StorageError(
            f"cannot create {path}: {directory} is not writable by uid {os.getuid()} (owned by uid "
            f"{st.st_uid}, mode {st.st_mode & 0o7777:04o}); {fix} or set {setting} to a writable path"
        )
    if not path.exists():  # a folder that takes no files whatever its mode (/proc, /sys): SQLite said ENOENT
        # a probe of this process and thread, not the database's own name: another process creating
        # the database meanwhile (a tuner and its helper opening a new study file) must keep its file
        probe = directory / f".{path.name}.{os.getpid()}-{threading.get_ident()}.probe"
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except OSError as exc:
            raise StorageError(
                f"cannot create {path} for {what}: {directory} does not take new files ({exc.strerror}); "
                f"set {setting} to a path on a writable file system"
            ) from None
        os.unlink(probe)


def _file_in_the_way(directory: Path) -> Path | None:
    """The first of `directory` and its parents that exists and is not a folder, if any."""
    for p in (directory, *directory.parents):
        if p.exists() or p.is_symlink():
            return None if p.is_dir() else p
    return None


def _driver_message(exc: SQLAlchemyError) -> str:
    """The driver's first line, without the statement and parameters SQLAlchemy appends (they
    would reach API error bodies and logs: other rows' values, our schema)."""
    orig = getattr(exc, "orig", None)
    text = str(orig) if orig is not None else str(exc)
    name = type(orig if orig is not None else exc).__name__
    return f"{name}: {(text.strip().splitlines() or [''])[0][:300]}"


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextlib.contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """Commit on success, roll back on error; database errors become StorageError."""
    session = factory()
    try:
        yield session
        session.commit()
    except SQLAlchemyError as exc:
        session.rollback()
        raise StorageError(f"database error: {_driver_message(exc)}") from exc
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
