"""`tuner serve`: the read-only config service."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from verify_tuner.cli.exits import clean_exit
from verify_tuner.cli.options import Integer
from verify_tuner.errors import BadSetting
from verify_tuner.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy import Engine


@click.command()
@click.option("--host", default=None, help="Bind address (TUNER_HOST, default 127.0.0.1).")
@click.option("--port", type=Integer(), default=None, help="Port (TUNER_PORT, default 8177).")
@click.option("--device", default=None, help="Device answered for when a request names none (TUNER_DEVICE).")
@click.option(
    "--read-only-database",
    is_flag=True,
    default=None,
    help="The database is a read-only snapshot: open it read-only and stay ready (TUNER_DATABASE_READ_ONLY).",
)
@click.pass_obj
@clean_exit
def serve(
    settings: Settings, host: str | None, port: int | None, device: str | None, read_only_database: bool | None
) -> None:
    """Run the read-only config service (FastAPI under uvicorn)."""
    from verify_tuner.api import server
    from verify_tuner.api.app import bind_health_port, create_app, health_port_error
    from verify_tuner.store.migrate import ensure_current, require_existing
    from verify_tuner.store.session import make_engine, safe_url

    settings = settings.with_overrides(host=host, port=port, device=device, database_read_only=read_only_database)
    try:
        settings.check_ports()
    except BadSetting as exc:
        raise click.ClickException(str(exc)) from None
    click.get_current_context().obj = settings  # so that an error's hint knows --read-only-database was given
    # fail fast, before binding; serving never creates a database (a mistyped path would leave an empty file)
    require_existing(settings.database_url)
    engine = make_engine(settings.database_url, immediate=False, read_only=settings.database_read_only, create=False)
    try:
        ensure_current(engine, safe_url(settings.database_url))
        if not settings.database_read_only:
            _check_writable(settings.database_url)
        if settings.device is not None:
            _check_device(engine, settings.device)
        else:
            settings = _pin_only_device(engine, settings)
    finally:
        engine.dispose()
    app = create_app(settings)
    try:
        sock = server.bind(settings)
    except OSError as exc:
        raise click.ClickException(
            f"cannot listen on TUNER_HOST {settings.host} port {settings.port} (--host/--port): {exc.strerror or exc}"
        ) from None
    if settings.health_port is not None:
        # bound here, not in the app's startup, so that a port in use is one line rather than uvicorn's traceback
        try:
            app.state.health_server = bind_health_port(settings, app.state.metrics)
        except OSError as exc:
            sock.close()
            raise click.ClickException(health_port_error(settings, exc)) from None
    _log_to_stderr()
    server.run(app, settings, sock)  # uvicorn, with the request limits of api/server.py


def _log_to_stderr() -> None:
    """The sidecar's own lines (where it listens, readiness turning, the database going and coming
    back) on stderr in uvicorn's format: uvicorn configures its own loggers only, and without a
    handler Python dropped every INFO line of ours."""
    import logging

    from uvicorn.logging import DefaultFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s", use_colors=None))
    logger = logging.getLogger("verify_tuner")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _check_writable(url: str) -> None:
    """Refuse an SQLite file this user cannot write unless --read-only-database says it is a snapshot:
    reading it no longer fails on setting WAL, and the sidecar's writes and readiness need it writable."""
    import os
    from pathlib import Path

    from sqlalchemy.engine import make_url
    from verify_tuner.cli.exits import READ_ONLY_HINT

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:") or "uri" in parsed.query:
        return
    path = Path(parsed.database).expanduser()
    # the directory too: SQLite writes its journal, or WAL's -wal and -shm, beside the file
    blocked = [str(p) for p in (path, path.parent) if not os.access(p, os.W_OK)]
    if blocked:
        where = parsed.render_as_string(hide_password=True)
        raise click.ClickException(
            f"database {where} is read-only (cannot write {', '.join(blocked)}): {READ_ONLY_HINT}"
        )


def _check_device(engine: Engine, name: str) -> None:
    """Refuse a default device that requests could not resolve: every request naming none would get a
    422 blaming a `device` query parameter the worker never sent."""
    from verify_tuner.errors import BadParameter
    from verify_tuner.kernels.limits import ALIASES
    from verify_tuner.store import devices, lookup
    from verify_tuner.store.session import session_factory, session_scope

    with session_scope(session_factory(engine)) as s:
        try:
            lookup.resolve_device(session=s, name=name, default=None)  # as a request naming it would
        except BadParameter:
            recorded = ", ".join(d.name for d in devices.list_devices(session=s)) or "none"
            raise click.ClickException(
                f"TUNER_DEVICE/--device {name!r} is neither a known GPU ({', '.join(ALIASES)}, or its CUDA name) "
                f"nor a device recorded in the database (recorded: {recorded})"
            ) from None


def _pin_only_device(engine: Engine, settings: Settings) -> Settings:
    """With no TUNER_DEVICE, requests naming no device are answered for the only recorded one; that
    answer is fixed here, at start: decided per request, a second device imported while serving
    turned every such request into a 422 (and /readyz stayed ready)."""
    from verify_tuner.store import devices
    from verify_tuner.store.session import session_factory, session_scope

    with session_scope(session_factory(engine)) as s:
        recorded = devices.list_devices(session=s)
    if len(recorded) != 1:
        # the README's curl names no device: without this line a fresh sidecar reported ready and
        # answered every such request 422, unexplained
        later = (
            "until the first device is recorded (a tuner's or an import's), which then stays the default"
            if not recorded
            else f"({len(recorded)} are recorded: {', '.join(d.name for d in recorded)})"
        )
        click.echo(
            f"warning: no default device: requests that name none get a 422 {later}; start with --device "
            "(TUNER_DEVICE) naming the workers' GPU, e.g. `tuner serve --device h200`",
            err=True,
        )
        return settings
    click.echo(f"default device: {recorded[0].name}, the only one recorded (TUNER_DEVICE/--device chooses)", err=True)
    return settings.with_overrides(device=recorded[0].name)
