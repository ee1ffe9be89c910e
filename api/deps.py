"""Dependencies shared by the routers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from sqlalchemy.orm import Session

from tuner.db.session import session_scope
from tuner.settings import Settings


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_db(request: Request) -> Iterator[Session]:
    with session_scope(request.app.state.read_sessions) as session:
        yield session


def get_write_db(request: Request) -> Iterator[Session]:
    with session_scope(request.app.state.write_sessions) as session:
        yield session


def require_token(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    token = request.app.state.settings.write_token
    if not token:
        raise HTTPException(403, "write endpoints are off: set TUNER_WRITE_TOKEN to enable them")
    if authorization != f"Bearer {token}":
        raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_db)]
WriteSessionDep = Annotated[Session, Depends(get_write_db)]
WriteAuth = Depends(require_token)
