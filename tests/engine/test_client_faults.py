"""The worker client against sidecars and tables that are broken in the ways a host meets them: an
answer cut short, another service on the port, a hand-edited or truncated table. fetch() passes
each such source over and says why; it never raises."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from verify_tuner.engine.client import ConfigClient


def http_answer(body: bytes, *, length: int | None = None) -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length or len(body)}\r\n\r\n"
    return head.encode() + body


@contextlib.contextmanager
def raw_sidecar(send: Callable[[socket.socket], None]) -> Iterator[str]:
    """A TCP server on localhost that reads a request and then calls `send` with the connection."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                with contextlib.suppress(OSError):  # the client may hang up first
                    send(conn)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        server.close()


def client(url: str | None, tmp_path, **kw) -> ConfigClient:  # type: ignore[no-untyped-def]
    return ConfigClient(url, H=8, q_len=9, device="NVIDIA H200", snapshot_dir=tmp_path / "snap", timeout_s=1.0, **kw)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (http_answer(b'{"kernel_hash": "', length=40_000), "IncompleteRead"),  # the sidecar died mid-answer
        (b"SSH-2.0-OpenSSH_9.2\r\n", "BadStatusLine: SSH-2.0-OpenSSH_9.2"),  # another service on the port
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", "LineTooLong"),
    ],
    ids=["cut-short", "not-http", "header-too-long"],
)
def test_an_answer_that_is_not_whole_http_is_passed_over(tmp_path, raw, why):
    with raw_sidecar(lambda conn: conn.sendall(raw)) as url:
        c = client(url, tmp_path)
        assert c.fetch() == "heuristic"
        assert f"sidecar unavailable at {url} (no valid HTTP answer: {why}" in c.reason
        assert "\n" not in c.reason and c.lookup(46000, 8) is not None
        assert c.refresh() == "failed" and "no valid HTTP answer" in c.refresh_error  # type: ignore[operator]
