"""What every writer shares: INSERT ... ON CONFLICT portable across SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from sqlalchemy import CursorResult, Executable
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from verify_tuner.errors import StorageError


def _insert(session: Session, model: type, row: dict[str, Any]) -> sqlite.Insert | postgresql.Insert:
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        return sqlite.insert(model).values(**row)
    if dialect == "postgresql":
        return postgresql.insert(model).values(**row)
    raise StorageError(f"unsupported database dialect {dialect!r}")


def affected(session: Session, stmt: Executable) -> int:
    """The rows an UPDATE or DELETE changed (its result is the cursor's, which counts them)."""
    result = session.execute(stmt)
    assert isinstance(result, CursorResult), type(result)
    return result.rowcount


def upsert(session: Session, model: type, *, key_cols: dict[str, Any], values: dict[str, Any]) -> None:
    """INSERT ... ON CONFLICT DO UPDATE, portable across SQLite and PostgreSQL: concurrent writers
    of one key never fail and never lose a committed row."""
    stmt = _insert(session, model, {**key_cols, **values})
    session.execute(stmt.on_conflict_do_update(index_elements=list(key_cols), set_=values))


def insert_ignore(session: Session, model: type, *, key_cols: dict[str, Any], values: dict[str, Any]) -> None:
    stmt = _insert(session, model, {**key_cols, **values})
    session.execute(stmt.on_conflict_do_nothing(index_elements=list(key_cols)))
