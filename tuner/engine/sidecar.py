"""The config client's request for a sidecar's table, with the standard library's HTTP (the bare
package installs no HTTP client), and the words for a sidecar that refused or failed it."""

from __future__ import annotations

import http.client
import ipaddress
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

#: The largest answer a worker reads: a whole /configs table for one (H, q_len) is ~0.1 MB, so a
#: longer body is another service (or a proxy's error page) streaming at it, not a table.
MAX_TABLE_BYTES = 16 << 20
_CHUNK = 1 << 16


class PassedOver(Exception):
    """Why a source was passed over, as `reason` words it."""


class ErrorStatus(Exception):
    """The sidecar answered an HTTP error status (a 304 too); `detail` is its body in one line."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"HTTP {code}: {detail}")
        self.code, self.detail = code, detail


class Requests:
    """One client's requests for its sidecar's table, one at a time, each waited for at most
    `timeout_s` in all: urllib's timeout bounds each socket operation only, so a sidecar trickling
    its answer would otherwise hold the caller for as long as it kept sending."""

    def __init__(self) -> None:
        self._last: threading.Thread | None = None
        # refresh() may be called from several threads: one checks and starts the request thread at a time
        self._lock = threading.Lock()

    def get_table(
        self, base_url: str, query: dict[str, object], etag: str | None, timeout_s: float
    ) -> tuple[dict, str | None]:
        """The sidecar's /configs answer for `query` and its ETag; ErrorStatus for an error status or
        a 304 for `etag`; TimeoutError when no whole answer came within `timeout_s`."""
        with self._lock:
            return self._get_table(base_url, query, etag, timeout_s)

    def _get_table(
        self, base_url: str, query: dict[str, object], etag: str | None, timeout_s: float
    ) -> tuple[dict, str | None]:
        if self._last is not None and self._last.is_alive():  # one thread a client however slow its sidecar
            raise TimeoutError(f"the answer to an earlier request is still coming, past timeout_s={timeout_s:g} s")
        out: list[tuple[dict, str | None] | Exception] = []

        def ask() -> None:
            try:
                out.append(_get_table(base_url, query, etag, timeout_s))
            except Exception as exc:  # noqa: BLE001 -- raised again in the caller's thread below
                out.append(exc)

        self._last = threading.Thread(target=ask, name="verify-tuner-sidecar", daemon=True)
        self._last.start()
        self._last.join(timeout_s)
        if not out:
            raise TimeoutError(f"no whole answer within timeout_s={timeout_s:g} s")
        if isinstance(out[0], Exception):
            raise out[0]
        return out[0]


def proxy_for(base_url: str) -> str | None:
    """The proxy a request to `base_url` goes through: the *_proxy environment's (no_proxy honoured),
    but never for a sidecar on this host -- a GPU node's HTTP_PROXY sent loopback requests to the
    proxy, and workers fell back to the heuristic blaming a sidecar that was up."""
    parts = urllib.parse.urlsplit(base_url)
    host = parts.hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:  # a name, not an address
        pass
    proxy = urllib.request.getproxies().get(parts.scheme)
    return None if proxy is None or urllib.request.proxy_bypass(host) else proxy


def where(base_url: str | None) -> str:
    """The sidecar as the client's reasons name it, with the proxy between (its credentials left out)."""
    proxy = proxy_for(base_url) if base_url else None
    if proxy is None:
        return str(base_url)
    p = urllib.parse.urlsplit(proxy)
    shown = p._replace(netloc=p.netloc.rpartition("@")[2]).geturl()
    return f"{base_url} (through the proxy {shown})"


def _get_table(base_url: str, query: dict[str, object], etag: str | None, timeout_s: float) -> tuple[dict, str | None]:
    q = urllib.parse.urlencode(query)
    req = urllib.request.Request(f"{base_url}/configs?{q}", headers={"If-None-Match": etag} if etag else {})
    deadline = time.monotonic() + timeout_s
    proxy = proxy_for(base_url)
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({} if proxy is None else {urllib.parse.urlsplit(base_url).scheme: proxy})
    )
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            return json.loads(_read_bounded(resp, deadline, timeout_s)), resp.headers.get("ETag")
    except urllib.error.HTTPError as exc:  # its body read here, within the caller's deadline
        raise ErrorStatus(exc.code, _error_detail(exc)) from None


def _read_bounded(resp: http.client.HTTPResponse, deadline: float, timeout_s: float) -> bytes:
    """The body, read in chunks that stop at MAX_TABLE_BYTES or the deadline: the request thread
    must end (and free what it read) soon after its caller stopped waiting, whatever the peer sends."""
    chunks, size = [], 0
    while chunk := resp.read1(_CHUNK):  # what one socket read brings: the deadline is checked as it comes
        size += len(chunk)
        if size > MAX_TABLE_BYTES:
            raise ValueError(f"answer longer than {MAX_TABLE_BYTES >> 20} MB: not a config table")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no whole answer within timeout_s={timeout_s:g} s")
        chunks.append(chunk)
    if resp.length:  # read1 ends at EOF quietly where read() raised: a Content-Length not reached
        raise http.client.IncompleteRead(b"".join(chunks), resp.length)
    return b"".join(chunks)


def refused(base_url: str | None, exc: ErrorStatus) -> str:
    """An HTTP error answer in words: a 5xx is a sidecar unavailable, else it refused the request."""
    if exc.code >= 500:
        return f"sidecar unavailable at {base_url} (HTTP {exc.code}: {exc.detail})"
    return f"sidecar at {base_url} refused this worker's request (HTTP {exc.code}: {exc.detail})"


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
    except (ValueError, KeyError, TypeError, RecursionError):
        return (raw.splitlines() or [str(exc.reason)])[0][:300]
    if isinstance(detail, list):  # a 422: each item names its parameter (a proxy's list may hold anything)
        detail = "; ".join(_item(d) for d in detail)
    return str(detail)[:300]


def _item(d: object) -> str:
    """One item of a `detail` list: FastAPI's {loc, msg}, else the item as it came."""
    if isinstance(d, dict) and isinstance(d.get("loc"), list):
        return f"{'.'.join(map(str, d['loc']))}: {d.get('msg')}"
    return str(d)[:100]
