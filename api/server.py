"""How `tuner serve` runs uvicorn: request-head limits and deadlines uvicorn has no setting for.

uvicorn's default parser (httptools) takes a header of any size, and neither of its protocols
times out a connection before its first complete request: a 200 MB header was read for 87 s,
and connections that sent half a request (or nothing) were held open forever. The h11 protocol
caps the buffered head (h11's own limit, `h11_max_incomplete_event_size`); the subclass below
answers that cap with 431 instead of uvicorn's 400, and closes a connection whose request head,
or body, does not arrive in time.
"""

from __future__ import annotations

import asyncio
import socket

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol
from verify_tuner.settings import Settings

#: The largest request head (request line and headers) read; a worker's lookup head is ~100 bytes.
MAX_HEAD_BYTES = 64 * 1024
#: Seconds a request head may take from its first byte (or from the connection, for the first one).
HEAD_TIMEOUT_S = 10.0
#: Seconds a request body may take after its head: an import of the 16 MiB cap at ~300 kB/s.
BODY_TIMEOUT_S = 60.0
#: Workers poll rarely: keep their idle connection open as long as proxies do.
KEEP_ALIVE_S = 75

_TIMEOUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_HEAD_TOO_LARGE_BODY = f"request head over {MAX_HEAD_BYTES} bytes".encode()
_HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_HEAD_TOO_LARGE_BODY), _HEAD_TOO_LARGE_BODY)
)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's arrival and a 431 for a head over the cap."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: object = None
        self._arm(h11.IDLE, HEAD_TIMEOUT_S)  # a connection that never sends a request is closed too

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and self._head_too_large(data):
            self._refuse_head()
            return
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.IDLE:  # a head has begun, on a kept-alive connection
            self._arm(h11.IDLE, HEAD_TIMEOUT_S)
        elif state is h11.SEND_BODY:
            self._arm(h11.SEND_BODY, BODY_TIMEOUT_S)
        else:  # the request is in (or the connection failed): uvicorn's keep-alive timer takes over
            self._disarm()

    def _head_too_large(self, data: bytes) -> bool:
        """Whether the head this read continues passes MAX_HEAD_BYTES. h11's cap holds only while the
        head is incomplete, so a whole head of 100 KB arriving in one read was taken."""
        pending = self.conn.trailing_data[0]
        if len(pending) + len(data) <= MAX_HEAD_BYTES:  # every read of a normal request: nothing to search
            return False
        buf = pending + data
        ends = [i for i in (buf.find(b"\r\n\r\n"), buf.find(b"\n\n")) if i >= 0]
        return (min(ends) if ends else len(buf)) > MAX_HEAD_BYTES

    def on_response_complete(self) -> None:
        if self.transport.is_closing() or not self.conn.trailing_data[0]:  # nothing pipelined: uvicorn's way
            super().on_response_complete()
            return
        # a pipelined head that came in the same read as the request just answered: uvicorn parses it
        # from the buffer below, past data_received's check, and without the head's deadline (it was
        # held until the 75 s keep-alive)
        if self._head_too_large(b""):
            self._refuse_head()
            return
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm(h11.IDLE, HEAD_TIMEOUT_S)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, phase: object, seconds: float) -> None:
        if self._deadline is not None and self._waiting_for is phase:
            return  # the deadline runs from the phase's first byte, not its latest
        self._disarm()
        self._waiting_for, self._deadline = phase, self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._waiting_for = None, None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.conn.our_state is h11.IDLE:  # no response begun: say why the connection closes
            self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()  # a handler waiting on the body sees a disconnect

    def send_400_response(self, msg: str) -> None:
        if len(self.conn.trailing_data[0]) <= MAX_HEAD_BYTES:
            super().send_400_response(msg)
            return
        # h11 refused the head for its size (it raises once its buffer passes the cap)
        self._refuse_head()

    def _refuse_head(self) -> None:
        """RFC 6585's 431 for a head over the cap, and the connection closed."""
        self._disarm()
        self.transport.write(_HEAD_TOO_LARGE)  # written as bytes: h11 has no request to answer when it is whole
        self.transport.close()


def uvicorn_config(app: FastAPI, settings: Settings) -> uvicorn.Config:
    """The uvicorn Config `tuner serve` runs: no per-request access log (/metrics counts requests by
    route and status, and a log line per lookup would cost more than the lookup)."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        http=GuardedH11Protocol,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
    )


def bind(settings: Settings) -> socket.socket:
    """The main port's socket, bound before uvicorn starts: a port in use or a host that is no
    address of this machine is then an OSError for the CLI's one line, not uvicorn's log and exit 3."""
    from verify_tuner.api.health_server import address_family

    sock = socket.socket(address_family(settings.host, settings.port), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's own bind
        sock.bind((settings.host, settings.port))
    except OSError:
        sock.close()
        raise
    return sock


def run(app: FastAPI, settings: Settings, sock: socket.socket | None = None) -> None:
    """Serve in the foreground until SIGINT/SIGTERM, on `sock` (bind) if given."""
    uvicorn.Server(uvicorn_config(app, settings)).run(sockets=[sock] if sock is not None else None)
