"""Liveness and readiness."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from tuner.db.migrate import ensure_current
from tuner.errors import StorageError

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(request: Request) -> JSONResponse:
    engine = request.app.state.read_engine
    try:
        db_file = engine.url.database if engine.url.get_backend_name() == "sqlite" else None
        if db_file and db_file != ":memory:" and not Path(db_file).exists():
            # open connections still read the unlinked file: say so instead of looking healthy
            raise StorageError(f"database file {db_file} is missing")
        ensure_current(engine)
    except StorageError as exc:
        request.app.state.metrics.db_error()
        return JSONResponse({"status": "unavailable", "reason": str(exc)}, status_code=503)
    return JSONResponse({"status": "ready"})
