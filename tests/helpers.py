"""Shared helpers for tests that run the real server as a process."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def eventually(fn, what: str, within_s: float = 5.0, every_s: float = 0.05):  # type: ignore[no-untyped-def]
    """fn()'s first truthy answer, polled until `within_s`: a busy CI VM runs background checks late,
    so a test waits for the state it needs rather than sleeping a guess."""
    deadline = time.monotonic() + within_s
    while not (out := fn()):
        assert time.monotonic() < deadline, what
        time.sleep(every_s)
    return out


def tuner_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tuner", *args]


def run_tuner(
    env: dict[str, str],
    *args: str,
    block: str | None = None,
    wrap: Sequence[str] = (),
    timeout: float = 60,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`tuner ARGS` in a fresh process, as an operator runs it (optionally with one package made
    unimportable, as on a machine that lacks it; `wrap` prefixes the command; `cwd` its folder)."""
    code = "import sys; sys.argv[0] = 'tuner'; from verify_tuner.cli.entry import main; main()"
    if block:
        code = f"import sys; sys.modules[{block!r}] = None; " + code
    return subprocess.run(
        [*wrap, sys.executable, "-c", code, *args],
        env={**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


#: Root without the capabilities that let it ignore file modes: as a non-root user would be.
NO_DAC_OVERRIDE = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner")


def file_modes_bind() -> tuple[str, ...] | None:
    """A command prefix under which file modes bind a child process (nothing for a normal user),
    or None where that cannot be had (root without setpriv)."""
    if os.geteuid() != 0:
        return ()
    return NO_DAC_OVERRIDE if shutil.which("setpriv") else None


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
