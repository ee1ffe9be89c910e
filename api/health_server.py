"""A second listener, on its own port (TUNER_HEALTH_PORT) and threads, that answers only
/healthz and /readyz: the port a kubelet's probes should hit.

On the main port a new connection is served in turns of the event loop (accept, make the
transport, read, run the handler), and each turn serves every ready connection first: under 200
keep-alive clients flat out a probe on a new connection waits several such turns (the numbers
are in bench/results/load_test.md). Here the
listener's own thread wakes on the probe's connection: the answer waits only for the GIL, which
the loop releases at each of its socket calls. /readyz answers from the same record as on the
main port (api/readiness.py), never from the database directly.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from verify_tuner.api.metrics import Metrics
from verify_tuner.api.readiness import Readiness

log = logging.getLogger(__name__)

#: Connections answered at once; more are closed unanswered (a probe sends one at a time).
MAX_CONNECTIONS = 8
#: Seconds a connection may take to send its whole request: a kubelet sends it at once.
REQUEST_TIMEOUT_S = 2.0


def address_family(host: str, port: int) -> socket.AddressFamily:
    """The family of the first address `host` resolves to for listening (socket.gaierror if none)."""
    return socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]


class _Handler(BaseHTTPRequestHandler):
    server: HealthServer
    protocol_version = "HTTP/1.1"
    timeout = REQUEST_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        # The socket timeout bounds each read, not the request: a client sending a header line
        # every 1.5 s held its slot for ever, and 8 such held the port. At the deadline the
        # connection is shut, which ends the blocked read and frees the slot.
        self._deadline = threading.Timer(REQUEST_TIMEOUT_S, self._expire)
        self._deadline.daemon = True
        self._deadline.start()

    def _expire(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed
            pass

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

    def do_GET(self) -> None:
        self._answer(body_too=True)

    def do_HEAD(self) -> None:  # a load balancer's probe: the GET's status and headers
        self._answer(body_too=False)

    def _answer(self, *, body_too: bool) -> None:
        self._deadline.cancel()  # the request is in: the answer is written however slowly it is read
        start, path = time.perf_counter(), self.path.partition("?")[0]
        if path == "/healthz":
            status, body = 200, {"status": "ok"}
        elif path == "/readyz":
            status, body = self.server.readiness.answer()
        else:
            status, body = 404, {"detail": "this port answers /healthz and /readyz only"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("connection", "close")
        self.end_headers()
        if body_too:
            self.wfile.write(data)
        self.close_connection = True
        self.server.count(path, status, time.perf_counter() - start)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no line per probe, as on the main port (access_log=False); /metrics counts them


class HealthServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # the listen backlog: socketserver's 5 would drop a burst of probes

    readiness: Readiness  # set by start(): the app makes it after the port is bound

    def __init__(self, host: str, port: int, metrics: Metrics) -> None:
        """Bind host:port now (OSError if it cannot be had), in the family `host` resolves to:
        socketserver's default is IPv4 only, so TUNER_HOST=:: would fail."""
        self.metrics = metrics
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.address_family = address_family(host, port)
        super().__init__((host, port), _Handler)
        self._thread = threading.Thread(target=self.serve_forever, name="tuner-health", daemon=True)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # HTTPServer's would look the host up in DNS
        host, self.server_port = self.server_address[:2]
        self.server_name = host.decode() if isinstance(host, bytes | bytearray) else host

    def count(self, path: str, status: int, seconds: float) -> None:
        route = path if path in ("/healthz", "/readyz") else "unmatched"
        self.metrics.request(f"{route} (health port)", "GET", status, seconds)
        if status == 503:
            self.metrics.db_error()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # the client left before the answer: its business
            return
        log.exception("health port: answering %s failed", client_address)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # a flood of connections cannot grow threads
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def start(self, readiness: Readiness) -> None:
        self.readiness = readiness
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
