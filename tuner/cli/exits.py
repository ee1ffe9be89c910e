"""The one place where the CLI turns expected failures into one line on stderr and exit 1.

Expected: the project's typed errors, a database that cannot be reached, read or written, a file
or folder the operator named that cannot be written, an optional package that is missing, an
unknown migration revision. Anything else is a bug in this project and keeps its traceback.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from verify_tuner.settings import Settings

#: Optional packages a command may need, with how to get them.
OPTIONAL = {
    "pycuda": "pip install -e '.[cuda]' (needs the CUDA toolkit)",
    "torch": "pip install -e '.[cuda]'",
    "matplotlib": "pip install matplotlib",
    "numpy": "pip install numpy",
    "psycopg": "pip install 'verify-tuner[postgres]'",
}

#: What an operator's path can run into: no such folder, no permission, a read-only mount, a full disk.
FILE_ERRNOS = {
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EEXIST,
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOSPC,
    errno.EDQUOT,
}

READ_ONLY_HINT = (
    "to serve a read-only snapshot, use `tuner serve --read-only-database` (TUNER_DATABASE_READ_ONLY=1); "
    "other commands need the database writable by this user"
)


def clean_exit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command so that expected failures (see the module) exit 1 with one line."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from alembic.util import CommandError
        from sqlalchemy.exc import SQLAlchemyError
        from verify_tuner.errors import TunerError

        try:
            return fn(*args, **kwargs)
        except (TunerError, SQLAlchemyError, OSError, ModuleNotFoundError, CommandError) as exc:
            message = operator_message(exc)
            if message is None:
                raise
            raise click.ClickException(message) from None

    return wrapper


def operator_message(exc: BaseException) -> str | None:
    """The line an operator reads for `exc`, or None when it is a bug (the caller re-raises it)."""
    from alembic.util import CommandError
    from verify_tuner.errors import StorageError, TunerError

    if isinstance(exc, StorageError) and (db := database_message(exc.__cause__)):
        return db  # the cause says it better, without SQLAlchemy's statement and link
    if isinstance(exc, TunerError | CommandError):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError):
        top = (exc.name or "").split(".")[0]
        return f"this command needs {top}: {OPTIONAL[top]}" if top in OPTIONAL else None
    if isinstance(exc, OSError):
        if exc.errno not in FILE_ERRNOS or exc.filename is None:
            return None
        return f"{exc.filename}: {exc.strerror}"
    return database_message(exc)


def database_message(exc: BaseException | None, where: str | None = None) -> str | None:
    """One line for a database that is down, unreadable, read-only or not a database at all, or None
    for any other database error (a constraint or a statement of ours failing is a bug). `where`
    names the database (default: the command's config database, without its password)."""
    from sqlalchemy.exc import DatabaseError, InterfaceError, OperationalError

    if not isinstance(exc, OperationalError | InterfaceError) and type(exc) is not DatabaseError:
        return None
    from verify_tuner.store.session import error_line

    first = error_line(exc)
    where = where or _current_database()
    if "readonly database" in first or ("unable to open database file" in first and _read_only_wal()):
        return f"database {where} is read-only ({first}): {_read_only_hint()}"
    if type(exc) is DatabaseError:
        return f"database {where} cannot be read: {first}"
    return f"database unavailable: {first} ({where})"


def _read_only_hint() -> str:
    """What to do about a read-only database: the flag, unless the command already opened it read-only
    or another user's -wal/-shm beside it are what cannot be written."""
    settings = _current_settings()
    if settings is not None and (foreign := _foreign_companions(settings.database_url)):
        owners = ", ".join(f"{p.name} (uid {_owner(p)})" for p in foreign)
        return (
            f"this user cannot write {owners}: SQLite made them for another user who opened the database; "
            "remove them while no process has it open, or run every user of it in one group with "
            "group-writable files"
        )
    if settings is None or not settings.database_read_only:
        return READ_ONLY_HINT
    if _in_wal(settings.database_url):
        return (
            "it was opened read-only as asked, but the file is in WAL mode, which SQLite reads only with its "
            "-wal and -shm writable beside it: serve a copy in rollback-journal mode, as `tuner db snapshot` writes"
        )
    return (
        "it was opened read-only as asked, yet SQLite needs to write beside it (a journal left by an "
        "interrupted writer?): serve a fresh copy made by `tuner db snapshot`"
    )


def _owner(path: Any) -> str:
    try:
        return str(path.stat().st_uid)
    except OSError:  # SQLite removed it meanwhile
        return "?"


def _foreign_companions(url: str) -> list[Any]:
    from pathlib import Path

    from sqlalchemy.engine import make_url
    from verify_tuner.store.health import unwritable_companions

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return []
    try:
        return unwritable_companions(Path(parsed.database).expanduser())
    except OSError:
        return []


def _read_only_wal() -> bool:
    """Whether the command opened its database read-only and the file is in WAL mode (SQLite then
    cannot even open it where its -wal and -shm cannot be made: a read-only mount)."""
    settings = _current_settings()
    return settings is not None and settings.database_read_only and _in_wal(settings.database_url)


def _in_wal(url: str) -> bool:
    """Whether an SQLite file's header says WAL (its read and write versions, bytes 18 and 19, are 2)."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return False
    try:
        with open(Path(parsed.database).expanduser(), "rb") as f:
            return f.read(20)[18:20] == b"\x02\x02"
    except OSError:
        return False


def _current_settings() -> Settings | None:
    """The settings of the running command (with its own options, where it stored them on its context)."""
    from verify_tuner.settings import Settings

    ctx = click.get_current_context(silent=True)
    return ctx.find_object(Settings) if ctx else None


def _current_database() -> str:
    """The database URL of the running command, without its password."""
    from verify_tuner.store.session import safe_url

    settings = _current_settings()
    return safe_url(settings.database_url) if settings else "?"
