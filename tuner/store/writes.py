"""What every writer shares: INSERT ... ON CONFLICT portable across SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from sqlalchemy import CursorResult, Executable
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from verify_tuner.errors import StorageError


def _insert(session: Session, model: type, row: dict[str, Any] | None = None) -> sqlite.Insert | postgresql.Insert:
    """The dialect's INSERT of `model`, with `row`'s values (without them: executemany's)."""
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        stmt: sqlite.Insert | postgresql.Insert = sqlite.insert(model)
    elif dialect == "postgresql":
        stmt = postgresql.insert(model)
    else:
        raise StorageError(f"unsupported database dialect {dialect!r}")
    return stmt if row is None else stmt.values(**row)


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


def upsert_many(session: Session, model: type, *, key_names: list[str], rows: list[dict[str, Any]]) -> None:
    """`upsert` of many rows in one executemany (each row's own values on conflict): an import of
    30 000 rows was ~7 statements a row, past the sidecar's deadline. Every row has the same columns."""
    if not rows:
        return
    stmt = _insert(session, model)
    value_names = [c for c in rows[0] if c not in key_names]
    stmt = stmt.on_conflict_do_update(index_elements=key_names, set_={c: stmt.excluded[c] for c in value_names})
    session.connection().execute(stmt, rows)


def insert_ignore(session: Session, model: type, *, key_cols: dict[str, Any], values: dict[str, Any]) -> None:
    stmt = _insert(session, model, {**key_cols, **values})
    session.execute(stmt.on_conflict_do_nothing(index_elements=list(key_cols)))
