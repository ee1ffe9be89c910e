"""App factory. Data flow: kernels -> tuner -> database -> here; this layer only reads the
database through verify_tuner.store.lookup and the store's query modules and speaks HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import Engine
from verify_tuner.api.deadline import NoAnswer, within
from verify_tuner.api.file_watch import FileState, FileWatch
from verify_tuner.api.head import AllowedMethods, HeadAsGet
from verify_tuner.api.health_server import HealthServer
from verify_tuner.api.metrics import Metrics, MetricsMiddleware
from verify_tuner.api.public import tell
from verify_tuner.api.readiness import Readiness
from verify_tuner.api.routes import admin, config, health
from verify_tuner.api.table_cache import TableCache
from verify_tuner.errors import BadParameter, StorageError
from verify_tuner.settings import Settings
from verify_tuner.store.migrate import ensure_current
from verify_tuner.store.session import make_engine, session_factory

READ_BUSY_TIMEOUT_MS = 2000  # WAL readers do not wait on writers; a longer wait is a fault to report

log = logging.getLogger(__name__)


async def _revalidate_forever(app: FastAPI) -> None:
    cache, failing = app.state.tables, None
    while True:
        try:
            await _check_once(app)
        except NoAnswer as exc:  # a hang is an outage: requests get the last good table, marked stale
            cache.fail(str(exc))
        except Exception:  # a bug here must not stop the checks: the request path would go to the DB
            log.exception("config cache re-check failed")
        failing = _log_outage(failing, cache.failure)
        await asyncio.sleep(cache.recheck_s)


def _log_outage(was: str | None, now: str | None) -> str | None:
    """One line when the database stops answering the background check (missing, hung, failing) and
    one when it answers again: the operator's record of an outage /readyz shows only while it lasts."""
    if now is not None and was is None:
        log.warning("database unavailable: %s; cached tables are served marked stale, others are 503s", now)
    elif now is None and was is not None:
        log.info("database answers again")
    return now


async def _check_once(app: FastAPI) -> None:
    cache, watch = app.state.tables, app.state.file_watch
    # one stat(): cheap enough for the event loop; new data clears the tables (on_new_data), as the new
    # data's stamp may equal the old one's
    if watch.check() is FileState.MISSING:
        cache.fail(watch.missing_reason())
        return
    if await within(app.state.settings.db_timeout_s, cache.revalidate, app.state.read_sessions):
        app.state.metrics.tables_checked()


def _engines(settings: Settings) -> tuple[Engine, Engine]:
    """The readers' and the writers' engines; neither creates a missing SQLite file."""
    read_engine = make_engine(
        settings.database_url,
        immediate=False,
        busy_timeout_ms=READ_BUSY_TIMEOUT_MS,
        read_only=settings.database_read_only,
        timeout_s=settings.db_timeout_s,
        create=False,
    )
    write_engine = make_engine(settings.database_url, immediate=True, timeout_s=settings.db_timeout_s, create=False)
    return read_engine, write_engine


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = app.state.settings
    read_engine, write_engine = _engines(settings)
    watch = FileWatch(settings.database_url, [read_engine, write_engine], on_new_data=app.state.tables.clear)
    try:
        if watch.check() is FileState.MISSING:
            raise StorageError(f"{watch.missing_reason()}: run `tuner db upgrade` to create it")
        ensure_current(read_engine)  # refuse to start on an outdated schema, naming the fix
    except StorageError as exc:
        read_engine.dispose()
        write_engine.dispose()
        raise RuntimeError(str(exc)) from None
    app.state.read_engine, app.state.write_engine, app.state.file_watch = read_engine, write_engine, watch
    app.state.read_sessions = session_factory(read_engine)
    app.state.write_sessions = session_factory(write_engine)
    checker = asyncio.create_task(_revalidate_forever(app))
    app.state.readiness = readiness = Readiness(settings)
    readiness.start()
    health_server = _health_server(app) if settings.health_port is not None else None
    yield
    if health_server is not None:
        health_server.stop()
    readiness.stop()
    checker.cancel()
    read_engine.dispose()
    write_engine.dispose()


def _health_server(app: FastAPI) -> HealthServer:
    settings = app.state.settings
    server = app.state.health_server  # bound by `tuner serve` before uvicorn starts (bind_health_port)
    if server is None:
        try:
            server = bind_health_port(settings, app.state.metrics)
        except OSError as exc:  # a port in use: fail the start, as uvicorn does for the main port
            app.state.readiness.stop()
            raise RuntimeError(health_port_error(settings, exc)) from None
    server.start(app.state.readiness)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    log.info("health probes on http://%s:%d (/healthz, /readyz)", host, settings.health_port)
    return server


def bind_health_port(settings: Settings, metrics: Metrics) -> HealthServer:
    """The health port's listener, bound (OSError when it cannot be: in use, no such address)."""
    assert settings.health_port is not None
    return HealthServer(settings.host, settings.health_port, metrics)


def health_port_error(settings: Settings, exc: OSError) -> str:
    where = f"TUNER_HEALTH_PORT {settings.health_port} (TUNER_HOST {settings.host})"
    return f"cannot listen on {where}: {exc.strerror or exc}"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()

    app = FastAPI(
        title="verify-attention config service",
        version="0.1.0",
        lifespan=_lifespan,
        # /config/ is a 404, not a 307 to an absolute URL built from the request's Host header
        redirect_slashes=False,
        # Swagger and ReDoc load from a CDN (a blank page air-gapped): /openapi.json is the API's description
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served below, as a route of its own: FastAPI's was counted as "unmatched"
        description="Tuned NSPLIT/HT/TK/BLOCK for the MLA verify-attention kernel, per device, H, "
        "q_len and prefix bucket.",
    )
    app.state.settings = settings
    app.state.pinned_device = None  # set by the first device-less lookup when no default is configured
    app.state.health_server = None
    from importlib.metadata import PackageNotFoundError, version

    from verify_tuner.kernels import KERNEL_VERSION, kernel_hash

    try:
        pkg_version = version("verify-tuner")
    except PackageNotFoundError:  # run from a checkout without installing (the GPU machine)
        pkg_version = "unknown"
    app.state.metrics = Metrics(version=pkg_version, kernel_hash=kernel_hash(), kernel_version=KERNEL_VERSION)
    app.state.tables = TableCache()
    app.state.metrics.count_stale_rows(lambda: app.state.tables.stale_rows)
    app.include_router(config.router)
    app.include_router(health.router)
    app.include_router(admin.router)

    app.add_middleware(HeadAsGet)  # inside the metrics: a HEAD is counted as a HEAD
    app.add_middleware(AllowedMethods, routes=app.routes)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    _handle_errors(app)

    @app.get("/openapi.json", include_in_schema=False)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/metrics", tags=["health"], response_class=Response)
    def metrics() -> Response:
        return Response(app.state.metrics.render(), media_type=app.state.metrics.content_type)

    return app


#: The characters of a rejected value a 422 echoes: enough to recognise it, not a megabyte back.
ECHO_CHARS = 64


def _echo(value: object) -> object:
    if isinstance(value, str) and len(value) > ECHO_CHARS:
        return f"{value[:ECHO_CHARS]}... ({len(value)} characters)"
    return value


def _handle_errors(app: FastAPI) -> None:
    """A bad parameter is a 422 naming it; a database failure a 503 saying its kind (api/public.py)."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own body, with each rejected value cut short
        errors = [{**e, "input": _echo(e["input"])} if "input" in e else e for e in exc.errors()]
        return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)

    @app.exception_handler(BadParameter)
    async def _bad_parameter(_: Request, exc: BadParameter) -> JSONResponse:
        return JSONResponse(
            {"detail": [{"loc": ["query", exc.param], "msg": exc.message, "type": "value_error"}]}, status_code=422
        )

    @app.exception_handler(StorageError)
    async def _storage(request: Request, exc: StorageError) -> JSONResponse:
        app.state.metrics.db_error()
        # the write token's holder reads the detail; anyone else a phrase, the detail going to the log
        detail = str(exc) if getattr(request.state, "token_holder", False) else tell(str(exc))
        return JSONResponse({"detail": f"config database unavailable: {detail}"}, status_code=503)
