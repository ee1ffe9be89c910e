"""The config database as the commands reach it: its URL checked where --database-url is parsed,
and sessions on a database that exists and is at the schema this version needs
(verify_tuner.store.migrate.checked_sessions)."""

from __future__ import annotations

import click
from verify_tuner.settings import Settings


def checked_sessions(settings: Settings):  # type: ignore[no-untyped-def]
    """Sessions on the settings' database, which must exist and hold the schema this version needs."""
    from verify_tuner.store import migrate

    return migrate.checked_sessions(settings.database_url)


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
