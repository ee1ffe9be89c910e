"""The config database as the commands reach it: its URL checked where --database-url is parsed,
and sessions on a database that exists and is at the schema this version needs."""

from __future__ import annotations

from pathlib import Path

import click
from verify_tuner.settings import Settings


def checked_sessions(settings: Settings):  # type: ignore[no-untyped-def]
    """Sessions on the settings' database, which must exist and hold the schema this version needs."""
    from verify_tuner.store import migrate

    require_existing(settings.database_url)
    return migrate.checked_sessions(settings.database_url)


def require_existing(url: str) -> None:
    """Only `tuner db upgrade` creates a database: elsewhere a missing SQLite file is a mistaken path."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:") or "uri" in parsed.query:
        return  # a server, memory, or an SQLite URI (file:...) that SQLite resolves itself
    if not Path(parsed.database).expanduser().exists():
        raise click.ClickException(
            f"no database at {parsed.database}: check the path, or create it with `tuner db upgrade`"
        )


def database_url_option(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """--database-url checked where it is parsed, so that a mistake in it is blamed on it."""
    if value is not None and (why := url_problem(value)):
        raise click.BadParameter(why)
    return value


def url_problem(url: str) -> str | None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError
    from verify_tuner.store.session import url_error

    try:
        make_url(url)
    except ArgumentError:
        return f"not a database URL: {url!r} (e.g. sqlite:////var/lib/tuner/configs.db or postgresql+psycopg://user@host/db)"
    return url_error(url)
