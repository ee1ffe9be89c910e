"""A loopback TCP proxy that can stop forwarding while keeping every connection open: a database
that stops answering without closing anything (a stalled network path, a frozen host)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class StallingProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self) -> None:
        """From now on nothing is forwarded either way; new connections are accepted and left waiting."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        """Refuse new connections from now on and cut the open ones (a server that went away)."""
        self._flowing.set()
        with contextlib.suppress(OSError):  # wakes the accept() a plain close() leaves blocked, and
            self._listener.shutdown(socket.SHUT_RDWR)  # still accepting one more connection
        self._listener.close()
        with self._lock:
            for s in self._socks:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return
            with self._lock:
                self._socks += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            self._flowing.wait()
            try:
                data = src.recv(65536)
            except OSError:
                break
            if not data:
                break
            self._flowing.wait()  # bytes read just as the stall began are held until it ends
            try:
                dst.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def stalling_proxy(target: tuple[str, int]) -> Iterator[StallingProxy]:
    proxy = StallingProxy(target)
    try:
        yield proxy
    finally:
        proxy.close()
