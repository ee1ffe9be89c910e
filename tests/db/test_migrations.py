from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from kernels.errors import StorageError
from tuner.db import migrate
from tuner.db.models import Base
from tuner.db.session import make_engine

TABLES = {"devices", "kernels", "tuning_studies", "tuning_trials", "best_configs", "tuner_alembic_version"}


def test_upgrade_from_empty_matches_the_models(db_url):
    engine = make_engine(db_url)
    with pytest.raises(StorageError, match="tuner db upgrade"):
        migrate.ensure_current(engine)
    migrate.upgrade(db_url)
    migrate.ensure_current(engine)
    assert TABLES <= set(inspect(engine).get_table_names())
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": migrate.VERSION_TABLE})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == [], f"migrations and models disagree: {diff}"
    engine.dispose()


def test_downgrade_upgrade_round_trip(db_url):
    engine = make_engine(db_url)
    migrate.upgrade(db_url)
    migrate.downgrade(db_url, "base")
    assert migrate.current_revision(engine) is None
    assert not (TABLES - {"tuner_alembic_version"}) & set(inspect(engine).get_table_names())
    migrate.upgrade(db_url)
    assert migrate.current_revision(engine) == migrate.head_revision()
    engine.dispose()


def test_own_version_table_leaves_optunas_alone(db_url):
    import optuna

    migrate.upgrade(db_url)
    optuna.create_study(storage=db_url, study_name="x")  # Optuna's schema, its own alembic_version
    engine = make_engine(db_url)
    names = set(inspect(engine).get_table_names())
    assert {"alembic_version", "tuner_alembic_version", "studies", "trials"} | TABLES <= names
    migrate.ensure_current(engine)
    engine.dispose()
