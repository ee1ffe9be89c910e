"""Dependencies shared by the routers."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from fastapi.routing import APIRoute
from pydantic import BeforeValidator
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
    request.state.token_holder = True  # its errors may say what failed (api/public.py)


async def strict_query(request: Request) -> None:
    """A query parameter given twice (H=8&H=16) or not declared by the route (a typo such as
    `bacth=32`) is a 422 naming it, not a silent last-wins or a default served in its place."""
    known = _declared_query(request.scope["route"])
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name not in known:
            raise BadParameter(name, f"unknown parameter (this endpoint takes {', '.join(sorted(known)) or 'none'})")
        if name in seen:
            raise BadParameter(name, "given more than once")
        seen.add(name)


def _declared_query(route: APIRoute) -> frozenset[str]:
    cached = getattr(route, "_tuner_query_names", None)  # routes are unhashable: cache on the route itself
    if cached is not None:
        return cached
    names: set[str] = set()
    todo = [route.dependant]
    while todo:  # the route's own parameters and those of its dependencies
        dependant = todo.pop()
        names.update(f.alias for f in dependant.query_params)
        todo.extend(dependant.dependencies)
    route._tuner_query_names = frozenset(names)  # type: ignore[attr-defined]
    return route._tuner_query_names  # type: ignore[attr-defined]


def _plain_digits(value: object) -> object:
    # int() would also take "8_0", " 8", "+8" and "8.0"; a query integer is what a reader sees
    if isinstance(value, str) and not (value.isascii() and value.isdigit() and len(value) <= MAX_DIGITS):
        if value[:1] == "-" and value[1:].isascii() and value[1:].isdigit():
            raise ValueError(f"must not be negative (plain decimal digits, at most {MAX_DIGITS})")
        raise ValueError(f"must be plain decimal digits (at most {MAX_DIGITS})")
    return value


MAX_DIGITS = 19  # every bound we check fits in 64 bits; longer text is refused before int() parses it
#: An integer query parameter: plain decimal digits, then the route's range checks.
Digits = BeforeValidator(_plain_digits)

#: A device parameter has no control characters (a NUL byte would reach the database driver):
#: a 422, not a 503.
DEVICE_PATTERN = r"^[^\x00-\x1f\x7f]+$"

SettingsDep = Annotated[Settings, Depends(get_settings)]
ReadSessions = Annotated[sessionmaker[Session], Depends(get_read_sessions)]
WriteSessions = Annotated[sessionmaker[Session], Depends(get_write_sessions)]
WriteAuth = Depends(require_token)
StrictQuery = Depends(strict_query)
