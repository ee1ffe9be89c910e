"""Alembic environment. Our version table is tuner_alembic_version: Optuna's RDB storage keeps
its own alembic_version, and both may live in one database."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection
from verify_tuner.store.migrate import VERSION_TABLE, include_name
from verify_tuner.store.models import Base
from verify_tuner.store.session import make_engine

config = context.config
target_metadata = Base.metadata


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        version_table=VERSION_TABLE,
        include_name=include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    # one-shot, unpooled; built that way rather than by swapping the pool afterwards, which loses
    # the first-connect hook that initialises the dialect (reflection in batch migrations needs it).
    # SQLite alters a table by copying it: with foreign keys on, dropping the old copy of
    # tuning_studies would cascade-delete every trial. They are off while migrating and checked after.
    # A file `tuner db upgrade` makes starts in WAL, where readers never wait on a writer; an existing
    # one keeps its journal mode (store.migrate.upgrade says which).
    wal = config.attributes.get("wal", True)
    url = config.get_main_option("sqlalchemy.url")
    assert url is not None  # verify_tuner.store.migrate sets it on every config it runs
    engine = make_engine(url, pooled=False, foreign_keys=False, wal=wal)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        include_name=include_name,
    )
    with context.begin_transaction():
        context.run_migrations()
        if connection.dialect.name == "sqlite":
            broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if broken:  # rolls the migration back
                raise RuntimeError(f"migration left rows pointing at missing parents: {broken[:5]}")


if context.is_offline_mode():
    run_offline()
else:
    run_online()
