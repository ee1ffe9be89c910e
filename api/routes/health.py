"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from verify_tuner.api.deadline import NoAnswer, within
from verify_tuner.store.health import DatabaseHealth, probe

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:  # on the event loop: no thread hop behind busy requests
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready when a new connection can read the current schema and, unless the database is
    declared read-only (TUNER_DATABASE_READ_ONLY), write: a volume that turned read-only under
    a running tuner is a fault to surface, even though /config keeps answering from it."""
    settings = request.app.state.settings
    try:
        health = await within(
            settings.db_timeout_s,
            probe,
            settings.database_url,
            read_only=settings.database_read_only,
            timeout_s=settings.db_timeout_s,
        )
    except NoAnswer as exc:
        health = DatabaseHealth(False, False, str(exc))
    db = {"readable": health.readable, "writable": health.writable, "read_only_expected": settings.database_read_only}
    if health.readable and (health.writable or settings.database_read_only):
        return JSONResponse({"status": "ready", "database": db} | ({"note": health.reason} if health.reason else {}))
    request.app.state.metrics.db_error()
    return JSONResponse({"status": "unavailable", "reason": health.reason, "database": db}, status_code=503)
