"""Shared helpers for tests that run the real server as a process."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tuner_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tuner", *args]


@contextlib.contextmanager
def running_server(
    env: dict[str, str], *, port: int, timeout: float = 30.0, wrap: Sequence[str] = ()
) -> Iterator[subprocess.Popen]:
    """`tuner serve` as a process, up and answering /healthz; `wrap` prefixes the command."""
    full_env = {**os.environ, **env, "TUNER_HOST": "127.0.0.1", "TUNER_PORT": str(port)}
    proc = subprocess.Popen(
        [*wrap, *tuner_cmd("serve")], env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}: {proc.stdout.read()}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise RuntimeError("server did not come up")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
