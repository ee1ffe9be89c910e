"""What every writer of a keyed table shares: INSERT ... ON CONFLICT portable across SQLite and
PostgreSQL, and the columns a workload key fills."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session
from verify_tuner.errors import StorageError
from verify_tuner.keys import ConfigKey


def _insert(session: Session, model: type, row: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
    """The dialect's INSERT of `model`, with `row`'s values (without them: executemany's)."""
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    elif dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert  # type: ignore[assignment]
    else:
        raise StorageError(f"unsupported database dialect {dialect!r}")
    return insert(model) if row is None else insert(model).values(**row)


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


def key_columns(device_id: int, kernel_id: int, key: ConfigKey) -> dict[str, Any]:
    """The columns a workload key fills in a table keyed by it (best configs, verifications)."""
    return {
        "device_id": device_id,
        "kernel_id": kernel_id,
        "dtype": key.dtype,
        "H": key.H,
        "q_len": key.q_len,
        "bucket": key.bucket,
        "batch_bucket": key.batch_bucket,
    }
