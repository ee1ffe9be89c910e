"""Alembic environment. Our version table is tuner_alembic_version: Optuna's RDB storage keeps
its own alembic_version, and both may live in one database."""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool

from tuner.db.migrate import VERSION_TABLE, include_name
from tuner.db.models import Base
from tuner.db.session import make_engine

config = context.config
target_metadata = Base.metadata


def run_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, version_table=VERSION_TABLE, include_name=include_name)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    engine.pool = pool.NullPool(engine.pool._creator)  # noqa: SLF001  one-shot
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(connection=connection, target_metadata=target_metadata, version_table=VERSION_TABLE,
                      render_as_batch=connection.dialect.name == "sqlite", include_name=include_name)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
