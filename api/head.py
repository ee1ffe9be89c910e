"""HEAD as HTTP means it (RFC 9110 9.3.2): the GET answer's status and headers, no body. FastAPI
routes answer only the methods they name, so a load balancer's `HEAD /healthz` met a 405."""

from __future__ import annotations

from typing import Any


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
