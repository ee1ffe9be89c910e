"""The config client's request for a sidecar's table, with the standard library's HTTP (the bare
package installs no HTTP client), and the words for a sidecar that refused or failed it."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request


class PassedOver(Exception):
    """Why a source was passed over, as `reason` words it."""


def get_table(base_url: str, query: dict[str, object], etag: str | None, timeout_s: float) -> tuple[dict, str | None]:
    """The sidecar's /configs answer for `query` and its ETag; a 304 for `etag` raises HTTPError."""
    q = urllib.parse.urlencode(query)
    req = urllib.request.Request(f"{base_url}/configs?{q}", headers={"If-None-Match": etag} if etag else {})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read()), resp.headers.get("ETag")


def refused(base_url: str | None, exc: urllib.error.HTTPError) -> str:
    """An HTTP error answer in words: a 5xx is a sidecar unavailable, else it refused the request."""
    detail = _error_detail(exc)
    if exc.code >= 500:
        return f"sidecar unavailable at {base_url} (HTTP {exc.code}: {detail})"
    return f"sidecar at {base_url} refused this worker's request (HTTP {exc.code}: {detail})"


def broken(base_url: str | None, exc: http.client.HTTPException) -> str:
    """An answer that is not whole HTTP in words, on one line whatever the peer sent."""
    detail = " ".join(str(exc).split())[:200] or "no detail"
    return f"sidecar unavailable at {base_url} (no valid HTTP answer: {type(exc).__name__}: {detail})"


def _error_detail(exc: urllib.error.HTTPError) -> str:
    """The one-line `detail` of the sidecar's error body (FastAPI's shape), else its first line."""
    try:
        raw = exc.read(4096).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):  # a body cut short says no more than the status
        return exc.reason or "no body"
    try:
        detail = json.loads(raw)["detail"]
    except (ValueError, KeyError, TypeError):
        return (raw.splitlines() or [str(exc.reason)])[0][:300]
    if isinstance(detail, list):  # a 422: each item names its parameter
        detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
    return str(detail)[:300]
