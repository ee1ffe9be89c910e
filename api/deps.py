"""Dependencies shared by the routers."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from sqlalchemy.orm import Session, sessionmaker
from verify_tuner.errors import BadParameter
from verify_tuner.settings import Settings


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
    scheme, _, given = (authorization or "").partition(" ")
    # the scheme is case-insensitive (RFC 9110); the token is compared in constant time
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})


async def single_valued_query(request: Request) -> None:
    """A query parameter given twice (H=8&H=16) is a 422 naming it, not a silent last-wins."""
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name in seen:
            raise BadParameter(name, "given more than once")
        seen.add(name)


#: A device parameter has no control characters (a NUL byte would reach the database driver):
#: a 422, not a 503.
DEVICE_PATTERN = r"^[^\x00-\x1f\x7f]+$"

SettingsDep = Annotated[Settings, Depends(get_settings)]
ReadSessions = Annotated[sessionmaker[Session], Depends(get_read_sessions)]
WriteSessions = Annotated[sessionmaker[Session], Depends(get_write_sessions)]
WriteAuth = Depends(require_token)
SingleValued = Depends(single_valued_query)
