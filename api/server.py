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
import logging
import signal
import socket

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol
from verify_tuner.settings import Settings

log = logging.getLogger(__name__)

#: The largest request head (request line and headers) read; a worker's lookup head is ~100 bytes.
MAX_HEAD_BYTES = 64 * 1024
#: Seconds a request head may take from its first byte (or from the connection, for the first one).
HEAD_TIMEOUT_S = 10.0
#: Seconds a request body may take after its head: an import of the 16 MiB cap at ~300 kB/s.
BODY_TIMEOUT_S = 60.0
#: Workers poll rarely: keep their idle connection open as long as proxies do.
KEEP_ALIVE_S = 75
#: asyncio's own loop, not uvloop: libuv accepts one connection per loop iteration (libuv #3696), and
#: a saturated iteration serves hundreds of ready connections, so new ones were taken ~14 a second:
#: 100 opened during flat-out load waited up to 6.8 s for a first byte (a worker fleet starting, a
#: probe on the main port). asyncio accepts up to the backlog per wakeup (bpo-27906): the same burst
#: was answered within 0.6 s, at the same throughput within this VM's noise (bench/load_test.py --loop).
EVENT_LOOP = "asyncio"
#: Header fields a request head may carry (Apache's LimitRequestFields, Tomcat's maxHeaderCount): h11
#: parses each in Python, and 13 000 empty ones cost 40x a lookup's CPU, under the size cap.
MAX_HEADER_FIELDS = 100
#: Seconds a body may keep arriving after its request was answered without reading it (a 401, a
#: 413): nginx's lingering_timeout. It was held to the 60 s body deadline, 1 byte/s.
LINGER_S = 5.0

_TIMEOUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def _431(why: str) -> bytes:
    body = why.encode()
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )


_HEAD_TOO_LARGE = _431(f"request head over {MAX_HEAD_BYTES} bytes")
_TOO_MANY_FIELDS = _431(f"more than {MAX_HEADER_FIELDS} header fields")


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's arrival and a 431 for a head over the cap."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: object = None
        self._lines, self._tail = 0, b""  # the head's line breaks so far, and its last bytes
        self._lingering = False
        self._arm(h11.IDLE, HEAD_TIMEOUT_S)  # a connection that never sends a request is closed too

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # answered already: the rest of the body is read and dropped, then goodbye
            super().data_received(data)
            if self.conn.their_state is not h11.SEND_BODY and not self.transport.is_closing():
                self.transport.close()
            return
        if self.conn.their_state is h11.IDLE:
            if self._head_too_large(data):
                self._refuse_head()
                return
            if self._too_many_fields(data):
                self._refuse_head(_TOO_MANY_FIELDS)
                return
        super().data_received(data)
        state = self.conn.their_state
        if state is not h11.IDLE:
            self._lines, self._tail = 0, b""  # the head is in: the next one counts afresh
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

    def _too_many_fields(self, data: bytes) -> bool:
        """Whether the head this read continues has passed MAX_HEADER_FIELDS lines: counted before h11
        parses them, up to the head's blank line (a body in the same read is not counted)."""
        buf = self._tail + data
        ends = [i for i in (buf.find(b"\r\n\r\n"), buf.find(b"\n\n")) if i >= 0]
        head = buf[: min(ends) + 1] if ends else buf
        self._lines += head.count(b"\n") - self._tail.count(b"\n")
        self._tail = data[-3:]
        return self._lines > MAX_HEADER_FIELDS + 1  # the request line, then the fields

    def on_response_complete(self) -> None:
        self._lines, self._tail = 0, b""  # the next head counts afresh
        if not self.transport.is_closing() and self.conn.their_state is h11.SEND_BODY:
            super().on_response_complete()
            self._linger()
            return
        if self.transport.is_closing() or not self.conn.trailing_data[0]:  # nothing pipelined: uvicorn's way
            super().on_response_complete()
            return
        # a pipelined head that came in the same read as the request just answered: uvicorn parses it
        # from the buffer below, past data_received's check, and without the head's deadline (it was
        # held until the 75 s keep-alive)
        if self._head_too_large(b""):
            self._refuse_head()
            return
        if self._too_many_fields(self.conn.trailing_data[0]):
            self._refuse_head(_TOO_MANY_FIELDS)
            return
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm(h11.IDLE, HEAD_TIMEOUT_S)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _linger(self) -> None:
        """The request was answered before its body was read (a 401 or 413 before the upload): read
        what comes for LINGER_S at most, so the client sees the answer rather than a reset, then close."""
        self._disarm()
        self._lingering = True
        self._waiting_for, self._deadline = h11.SEND_BODY, self.loop.call_later(LINGER_S, self._expired)

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

    def _refuse_head(self, answer: bytes = _HEAD_TOO_LARGE) -> None:
        """RFC 6585's 431 for a head over a cap, and the connection closed."""
        self._disarm()
        self.transport.write(answer)  # written as bytes: h11 has no request to answer when it is whole
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
        loop=EVENT_LOOP,
        http=GuardedH11Protocol,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
    )


def bind(settings: Settings) -> socket.socket:
    """The main port's socket, bound before uvicorn starts: a port in use or a host that is no
    address of this machine is then an OSError for the CLI's one line, not uvicorn's log and exit 3."""
    from verify_tuner.api.health_server import address_family

    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on connections accepted from a socket
    # that says it is TCP, and without it Nagle holds a response's second write for the client's
    # delayed ACK (tests/api/test_serve_settings.py)
    sock = socket.socket(address_family(settings.host, settings.port), socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's own bind
        sock.bind((settings.host, settings.port))
    except OSError:
        sock.close()
        raise
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, saying where it listens: it says so only for a socket it bound itself."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            for sock in sockets or ():
                host, port = sock.getsockname()[:2]
                log.info("listening on http://%s:%d", f"[{host}]" if ":" in host else host, port)


class _Stopped(Exception):
    """SIGTERM, re-raised by uvicorn once it has shut down."""


def _stopped(signum: int, frame: object) -> None:
    raise _Stopped


def run(app: FastAPI, settings: Settings, sock: socket.socket | None = None) -> None:
    """Serve in the foreground until SIGINT/SIGTERM, on `sock` (bind) if given; return once shut
    down. uvicorn re-raises the signal that stopped it into the handler it found: Ctrl-C came back
    as KeyboardInterrupt (click's "Aborted!", exit 1) and SIGTERM killed the process by the signal."""
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        _Server(uvicorn_config(app, settings)).run(sockets=[sock] if sock is not None else None)
    except (KeyboardInterrupt, _Stopped):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    log.info("stopped")
