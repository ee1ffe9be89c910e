"""Request bodies, read only after the route's dependencies (the write token) have passed, with
a size cap and a deadline: a client without a token, or one that sends too much or too slowly,
costs the server neither memory nor a waiting worker."""

from __future__ import annotations

import asyncio

from fastapi import HTTPException, Request


async def read_capped(request: Request, *, limit: int, timeout_s: float) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise HTTPException(413, _too_large(declared + " bytes", limit))
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:  # a chunked body declares no length: count as it arrives
                    raise HTTPException(413, _too_large(f"more than {limit} bytes", limit))
                chunks.append(chunk)
    except TimeoutError:
        raise HTTPException(408, f"request body not received within {timeout_s:g} s") from None
    return b"".join(chunks)


def _too_large(got: str, limit: int) -> str:
    return f"request body too large ({got}; the limit is {limit} bytes, TUNER_MAX_BODY_BYTES)"
