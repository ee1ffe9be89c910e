"""The config database as the commands reach it: its URL checked where --database-url is parsed,
and sessions on a database that exists and is at the schema this version needs
(verify_tuner.store.migrate.checked_sessions)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from verify_tuner.settings import Settings

if TYPE_CHECKING:  # the command's import stays light: SQLAlchemy is imported when a command needs it
    from sqlalchemy.orm import Session, sessionmaker


def checked_sessions(settings: Settings) -> sessionmaker[Session]:
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
    from verify_tuner.settings import masked_url
    from verify_tuner.store.session import url_error

    try:
        parsed = make_url(url)
    except ValueError as exc:  # a port that is not a number, an unclosed [IPv6 bracket
        return f"not a database URL: {masked_url(url)!r} ({exc})"
    except ArgumentError:
        return f"not a database URL: {masked_url(url)!r} (e.g. sqlite:////var/lib/tuner/configs.db or postgresql+psycopg://user@host/db)"
    if parsed.get_backend_name() == "sqlite":
        # each command is its own process: an in-memory database is gone when it exits, and a URI
        # filename (file:...?uri=true) is read as a path relative to the working folder
        if parsed.database in (None, "", ":memory:") or "mode=memory" in str(parsed.query):
            return "an in-memory SQLite database ends with each command: give a file, sqlite:////PATH/configs.db"
        if (parsed.database or "").startswith("file:") or "uri" in parsed.query:
            return (
                "SQLite URI filenames (file:...?uri=true) are not supported: give the path, sqlite:////PATH/configs.db"
            )
    return url_error(url)
