"""`tuner serve`: the read-only config service."""

from __future__ import annotations

import click
from verify_tuner.cli.exits import clean_exit
from verify_tuner.settings import Settings


@click.command()
@click.option("--host", default=None, help="Bind address (TUNER_HOST, default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (TUNER_PORT, default 8177).")
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
    from verify_tuner.api.app import create_app
    from verify_tuner.store.migrate import ensure_current, require_existing
    from verify_tuner.store.session import make_engine

    settings = settings.with_overrides(host=host, port=port, device=device, database_read_only=read_only_database)
    # fail fast, before binding; serving never creates a database (a mistyped path would leave an empty file)
    require_existing(settings.database_url)
    engine = make_engine(settings.database_url, immediate=False, read_only=settings.database_read_only, create=False)
    ensure_current(engine)
    server.run(create_app(settings), settings)  # uvicorn, with the request limits of api/server.py
