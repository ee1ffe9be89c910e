"""Dependencies shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from sqlalchemy.orm import Session, sessionmaker

from tuner.settings import Settings


async def get_settings(request: Request) -> Settings:  # async: no threadpool hop
    return request.app.state.settings


async def get_read_sessions(request: Request) -> sessionmaker[Session]:
    """The routes open their session inside the handler (`with session_scope(...)`), not in a
    yield-dependency: a dependency's teardown needs a second threadpool slot, and under load
    requests holding pool connections would wait for slots held by requests waiting for
    connections (a deadlock until the pool timeout)."""
    return request.app.state.read_sessions


async def get_write_sessions(request: Request) -> sessionmaker[Session]:
    return request.app.state.write_sessions


def require_token(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    token = request.app.state.settings.write_token
    if not token:
        raise HTTPException(403, "write endpoints are off: set TUNER_WRITE_TOKEN to enable them")
    if authorization != f"Bearer {token}":
        raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})


SettingsDep = Annotated[Settings, Depends(get_settings)]
ReadSessions = Annotated[sessionmaker[Session], Depends(get_read_sessions)]
WriteSessions = Annotated[sessionmaker[Session], Depends(get_write_sessions)]
WriteAuth = Depends(require_token)
