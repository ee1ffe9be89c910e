"""`tuner db`: schema migrations of the config database and its read-only snapshot."""

from __future__ import annotations

from pathlib import Path

import click
from verify_tuner.cli.exits import clean_exit
from verify_tuner.settings import Settings


@click.group()
def db() -> None:
    """Schema migrations of the config database."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="Target revision.")
@click.pass_obj
@clean_exit
def db_upgrade(settings: Settings, revision: str) -> None:
    """Create or migrate the schema (run once before `tuner serve` or `tuner study start`).

    Also creates Optuna's tables in a shared study storage, so that tuners starting together on
    several GPUs never race to create them (with a file per key: its directory and the blank
    storage each key's file is copied from when the key is first tuned)."""
    from verify_tuner.store import migrate
    from verify_tuner.store.session import safe_url

    known = migrate.revisions()
    if revision != "head" and revision not in known:  # alembic asserts on "" and "head+1": a traceback
        raise click.BadParameter(
            f"{revision!r} is not a revision: head or one of {', '.join(known)}", param_hint="--revision"
        )
    created = (path := _sqlite_file(settings.database_url)) is not None and not path.exists()
    migrate.upgrade(settings.database_url, revision)
    _prepare_studies(settings)
    now = _revision_now(settings.database_url)
    # alembic's upgrade to a revision the database is already past changes nothing: say so, not the target
    past = f" (already past {revision}: `tuner db upgrade` never downgrades)" if _names_other(revision, now) else ""
    # a mistyped path makes a new, empty database that a sidecar then serves heuristics from: say it is new
    what = "created a new database" if created else "database"
    click.echo(f"{what} at revision {now or 'none'}{past}: {safe_url(settings.database_url)}")


def _sqlite_file(url: str) -> Path | None:
    """The file an SQLite URL names (None for another database or an in-memory one)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:  # not a URL: the upgrade says so in its own words
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _revision_now(url: str) -> str | None:
    """The revision the database is at, read back after the upgrade."""
    from verify_tuner.store import migrate
    from verify_tuner.store.session import make_engine

    engine = make_engine(url, immediate=False, read_only=True)  # a look, never a write
    try:
        return migrate.current_revision(engine)
    finally:
        engine.dispose()


def _names_other(revision: str, now: str | None) -> bool:
    """Whether `revision` names one shipped revision other than `now` (head, an id; not a relative step)."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError
    from verify_tuner.store import migrate

    try:
        target = ScriptDirectory.from_config(migrate.alembic_config("sqlite://")).get_revision(revision)
    except CommandError:
        return False
    return target is not None and target.revision != now


@db.command("snapshot")
@click.argument("dest", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_obj
@clean_exit
def db_snapshot(settings: Settings, dest: Path) -> None:
    """Write DEST: an SQLite file with the devices and best configs of the config database, in
    rollback-journal mode, to mount read-only under `tuner serve --read-only-database`."""
    from verify_tuner.store.snapshot import write_snapshot

    n = write_snapshot(settings.database_url, dest)
    click.echo(f"wrote {dest}: {n} best configs")


@db.command("current")
@click.pass_obj
@clean_exit
def db_current(settings: Settings) -> None:
    """Print the schema revision of the database and the one this version needs; exit 1 unless they
    are the same (a script's check that the database is ready for this version)."""
    from verify_tuner.store import migrate
    from verify_tuner.store.session import make_engine, safe_url

    migrate.require_existing(settings.database_url)
    engine = make_engine(settings.database_url, immediate=False, read_only=True)  # a look, never a write
    try:
        current = migrate.current_revision(engine)
        click.echo(f"current: {current or 'none'}; head: {migrate.head_revision()}")
        # "none" reads as a database `db upgrade` will create the schema in: say when it is not one
        if current is None and (why := migrate.unversioned(engine, safe_url(settings.database_url))):
            raise click.ClickException(why)
        if current != migrate.head_revision():
            migrate.check_known(current, safe_url(settings.database_url))  # newer than this version: says so
            raise click.ClickException(f"the database is not at this version's schema: {migrate.UPGRADE_HINT}")
    finally:
        engine.dispose()


def _prepare_studies(settings: Settings) -> None:
    """prepare_study_storage, a database failure there named as the study storage's (it was blamed
    on the config database, which had just been upgraded)."""
    from sqlalchemy.exc import SQLAlchemyError
    from verify_tuner.cli.exits import database_message
    from verify_tuner.search.study_storage import prepare_study_storage
    from verify_tuner.store.session import safe_url

    try:
        prepare_study_storage(settings.studies)
    except SQLAlchemyError as exc:
        source = "TUNER_STUDY_STORAGE" if settings.study_storage else "the default; TUNER_STUDY_STORAGE sets another"
        message = database_message(exc, where=f"study storage {safe_url(settings.studies)}, {source}")
        if message is None:
            raise
        raise click.ClickException(message) from None
