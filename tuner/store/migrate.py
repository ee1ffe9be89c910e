"""Schema migrations: `tuner db upgrade`, and the check the API runs before serving."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import zlib
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from verify_tuner import migrations
from verify_tuner.errors import StorageError

VERSION_TABLE = "tuner_alembic_version"
UPGRADE_HINT = "run `tuner db upgrade` (with the same TUNER_DATABASE_URL)"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@functools.cache  # the shipped migrations do not change under a running process; parsing them is slow
def revisions() -> list[str]:
    """Every revision of the schema, oldest first (what `tuner db upgrade --revision` takes, or head)."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def head_revision() -> str:
    """The shipped schema's head (the last of `revisions()`: parsed once a process, since the
    sidecar's readiness probe asks every 0.5 s and parsing took most of its time)."""
    return revisions()[-1]


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def upgrade(url: str, revision: str = "head", setting: str = "TUNER_DATABASE_URL") -> None:
    """Migrate `url` to `revision`; `setting`: what named the file, for the message when it cannot be made."""
    cfg = alembic_config(url)
    # A new file starts in WAL; an existing one keeps its journal mode: a snapshot upgraded by habit
    # (or by compose's migrate step) must stay in rollback-journal mode to be served from a read-only mount.
    cfg.attributes["wal"] = new_sqlite_file(url)
    with upgrade_lock(url, setting):
        if not cfg.attributes["wal"]:  # an existing database: one of ours alembic can move, or empty
            from verify_tuner.store.session import make_engine, safe_url

            engine = make_engine(url)
            try:
                current = current_revision(engine)
                check_known(current, safe_url(url))  # a newer version's schema: alembic would only assert
                if current is None and (why := unversioned(engine, safe_url(url))):
                    raise StorageError(why)
            finally:
                engine.dispose()
        command.upgrade(cfg, revision)


#: Optuna's own tables: a PostgreSQL config database is also the studies' storage by default.
OPTUNA_TABLES = frozenset(
    {
        "studies", "study_directions", "study_user_attributes", "study_system_attributes", "trials",
        "trial_user_attributes", "trial_system_attributes", "trial_params", "trial_values",
        "trial_intermediate_values", "trial_heartbeats", "version_info", "alembic_version",
    }
)  # fmt: skip


def unversioned(engine: Engine, where: str) -> str | None:
    """Why a database with no schema version is not an empty one `db upgrade` may create the schema
    in (None: it is empty, or holds only Optuna's tables): another application's file, given by
    mistake, or a config database whose version table was dropped. `db upgrade` wrote the tables
    into the first and failed on the second."""
    from sqlalchemy import inspect
    from verify_tuner.store.models import Base

    names = set(inspect(engine).get_table_names()) - OPTUNA_TABLES - {VERSION_TABLE}  # empty after a downgrade to base
    ours = sorted(names & set(Base.metadata.tables))
    if ours:
        return (
            f"database {where} holds the config tables ({', '.join(ours[:4])}, ...) but no schema version "
            f"({VERSION_TABLE} is missing): `db upgrade` cannot tell their revision; restore that table from "
            "a backup, or start a new database"
        )
    if names:
        return (
            f"database {where} holds another application's tables ({', '.join(sorted(names)[:5])}): not a "
            "config database; point TUNER_DATABASE_URL at a file of its own"
        )
    return None


def new_sqlite_file(url: str) -> bool:
    """Whether `url` is an SQLite file that does not exist yet or is empty (one `db upgrade` creates)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return False
    path = Path(parsed.database).expanduser()
    return not path.exists() or path.stat().st_size == 0


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Autogenerate sees only this project's tables: Optuna's storage (studies, trials, its own
    alembic_version, ...) may share the database and must never appear as tables to drop."""
    from verify_tuner.store.models import Base

    return type_ != "table" or name in Base.metadata.tables or name == VERSION_TABLE


@contextlib.contextmanager
def upgrade_lock(url: str, setting: str = "TUNER_DATABASE_URL") -> Iterator[None]:
    """Serialise schema creation across processes: several `tuner db upgrade` (or tuners and
    sidecars started together) on one fresh database must all succeed, not race on the version
    table. PostgreSQL: a session advisory lock; SQLite: flock(2) on the database file itself
    (independent of SQLite's own fcntl locks; an empty new file is a valid empty database).
    `setting`: the variable named when the file cannot be created (check_writable)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        from verify_tuner.store.session import make_engine

        engine = make_engine(url)
        key = zlib.crc32(b"verify-tuner schema upgrade")
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(f"SELECT pg_advisory_lock({key})")
                try:
                    yield
                finally:
                    conn.exec_driver_sql(f"SELECT pg_advisory_unlock({key})")
                    conn.commit()
        finally:
            engine.dispose()
        return
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        from verify_tuner.store.session import check_writable

        path = Path(parsed.database).expanduser()
        check_writable(path, setting)  # the fix in one line, before anything tries to create the file
        with open(path, "ab") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
        return
    yield


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def ensure_current(engine: Engine, name: str | None = None) -> None:
    """Raise StorageError naming the fix when the schema is missing or not at head (`name`: the
    database as the operator gave it, where the engine's URL is an internal form of it)."""
    where = name or engine.url.render_as_string(hide_password=True)
    try:
        current = current_revision(engine)
    except Exception as exc:
        raise StorageError(f"cannot read the schema version of {where}: {exc}") from exc
    head = head_revision()
    if current != head:
        check_known(current, where)
        if current is None and (why := unversioned(engine, where)):
            raise StorageError(why)
        state = "empty (no schema)" if current is None else f"at revision {current}"
        raise StorageError(f"database {where} is {state}, this version needs {head}: {UPGRADE_HINT}")


def check_known(current: str | None, where: str) -> None:
    """StorageError when a newer verify-tuner migrated the database past every revision this one
    ships: `tuner db upgrade` cannot help (it would fail on alembic's 'Can't locate revision')."""
    if current is not None and current not in revisions():
        raise StorageError(
            f"database {where} is at revision {current}, which this version does not know (its newest is "
            f"{head_revision()}): a newer verify-tuner migrated it; run that version, or point this one at a "
            "database of its own schema"
        )


def require_existing(url: str) -> None:
    """Only `tuner db upgrade` creates a database: elsewhere a missing SQLite file is a mistaken path
    (opening it would leave an empty file, and its folders, behind)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:") or "uri" in parsed.query:
        return  # a server, memory, or an SQLite URI (file:...) that SQLite resolves itself
    if not Path(parsed.database).expanduser().exists():
        raise StorageError(f"no database at {parsed.database}: check the path, or create it with `tuner db upgrade`")


def checked_sessions(url: str) -> sessionmaker[Session]:
    """Sessions on `url`, which must exist, after checking its schema is current (StorageError
    naming the fix if not)."""
    from verify_tuner.store.session import make_engine, session_factory

    require_existing(url)
    engine = make_engine(url)
    ensure_current(engine)
    return session_factory(engine)
