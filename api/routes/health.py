"""Liveness and readiness (also on TUNER_HEALTH_PORT, api/health_server.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:  # on the event loop: no thread hop behind busy requests
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready when a new connection can read the current schema and, unless the database is
    declared read-only (TUNER_DATABASE_READ_ONLY), write: a volume that turned read-only under
    a running tuner is a fault to surface, even though /config keeps answering from it. Answered
    from the readiness thread's record (api/readiness.py): no database call on the request path."""
    status, body = request.app.state.readiness.answer()
    if status != 200:
        request.app.state.metrics.db_error()
    return JSONResponse(body, status_code=status)
