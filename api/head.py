"""HEAD as HTTP means it (RFC 9110 9.3.2): the GET answer's status and headers, no body. FastAPI
routes answer only the methods they name, so a load balancer's `HEAD /healthz` met a 405."""

from __future__ import annotations

from typing import Any

from starlette.routing import Match


class HeadAsGet:
    """Plain ASGI middleware: a HEAD request runs its path's GET handler and its body is dropped
    (the content-length stays the GET's, as the RFC allows); every other request passes through."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        inner = {**scope, "method": "GET"}

        async def without_body(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        try:
            await self.app(inner, receive, without_body)
        finally:
            if "route" in inner:  # the metrics middleware outside labels the request by its route
                scope["route"] = inner["route"]


#: The order methods are named in an Allow header.
_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class AllowedMethods:
    """The methods a path answers, said as RFC 9110 asks: a 405's Allow names all of them (Starlette
    named only the first matching route's, so `/configs` said GET though DELETE works, and never HEAD,
    which HeadAsGet answers), and OPTIONS on a known path is a 204 with that Allow, not a 405."""

    def __init__(self, app: Any, routes: list[Any]) -> None:
        self.app, self.routes = app, routes

    def methods(self, scope: dict[str, Any]) -> list[str]:
        """The methods the request's path answers, by the routes' own matching; [] for no route."""
        found = {m for m in _ORDER if any(r.matches({**scope, "method": m})[0] is Match.FULL for r in self.routes)}
        if "GET" in found:
            found.add("HEAD")
        if found:
            found.add("OPTIONS")
        return [m for m in _ORDER if m in found]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        options = scope["method"] == "OPTIONS"
        dropping = False

        async def answer(message: dict[str, Any]) -> None:
            # the router's own 405 goes through (so the metrics outside label it by its route) and is amended
            nonlocal dropping
            if message["type"] == "http.response.start" and message["status"] == 405:
                allowed = self.methods(scope)
                if allowed:
                    dropping = options
                    drop = (b"allow", b"content-length", b"content-type") if options else (b"allow",)
                    headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in drop]
                    headers.append((b"allow", ", ".join(allowed).encode()))
                    message = {**message, "status": 204 if options else 405, "headers": headers}
            elif message["type"] == "http.response.body" and dropping:
                message = {**message, "body": b""}
            await send(message)

        await self.app(scope, receive, answer)
