"""Schema migrations: `tuner db upgrade`, and the check the API runs before serving."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

import migrations
from kernels.errors import StorageError

VERSION_TABLE = "tuner_alembic_version"
UPGRADE_HINT = "run `tuner db upgrade` (with the same TUNER_DATABASE_URL)"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def ensure_current(engine: Engine) -> None:
    """Raise StorageError naming the fix when the schema is missing or not at head."""
    try:
        current = current_revision(engine)
    except Exception as exc:
        raise StorageError(f"cannot read the schema version of {engine.url!r}: {exc}") from exc
    head = head_revision()
    if current != head:
        state = "empty (no schema)" if current is None else f"at revision {current}"
        raise StorageError(f"database {engine.url.render_as_string(hide_password=True)} is {state}, "
                           f"this version needs {head}: {UPGRADE_HINT}")


def checked_sessions(url: str) -> sessionmaker[Session]:
    """Sessions on `url` after checking its schema is current (StorageError naming the fix if not)."""
    from tuner.db.session import make_engine, session_factory

    engine = make_engine(url)
    ensure_current(engine)
    return session_factory(engine)
