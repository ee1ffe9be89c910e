"""An operator's first hour, as the README says it, in a fresh HOME: the run command and its curl
on a fresh database, the same without --device, what the sidecar says while it runs (where it
listens, its database going and coming back) and Ctrl-C. The CLI and `tuner serve` as processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import eventually, free_port, tuner_cmd

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _readme_serve_args() -> list[str]:
    """The README's run command's `tuner serve ...` part."""
    line = next(ln for ln in README.splitlines() if "tuner db upgrade && tuner serve" in ln)
    return line.split("&& tuner serve", 1)[1].split()


def _readme_config_query() -> str:
    return re.search(r"curl 'http://127\.0\.0\.1:8177(/config\?[^']+)'", README).group(1)  # type: ignore[union-attr]


@pytest.fixture
def home(tmp_path) -> dict[str, str]:
    """A fresh HOME and no TUNER_* settings but the port (the README's 8177 may be taken here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNER_", "XDG_"))}
    env |= {"HOME": str(tmp_path / "home"), "TUNER_HOST": "127.0.0.1", "TUNER_PORT": str(free_port())}
    subprocess.run(tuner_cmd("db", "upgrade"), env=env, check=True, capture_output=True, timeout=60)
    return env


def _serve(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        tuner_cmd("serve", *args), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{env['TUNER_PORT']}"

    def up() -> bool:
        assert proc.poll() is None, proc.stdout.read()  # type: ignore[union-attr]
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    eventually(up, "tuner serve did not come up", within_s=30)
    return proc


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGINT) -> tuple[int, str]:
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=20)
    return proc.returncode, out


def test_the_readme_command_answers_the_readme_curl_on_a_fresh_database(home):
    assert _readme_serve_args() == ["--device", "h200"]  # what this test runs: the README's own words
    proc = _serve(home, *_readme_serve_args())
    try:
        r = httpx.get(f"http://127.0.0.1:{home['TUNER_PORT']}{_readme_config_query()}")
        assert r.status_code == 200 and r.json()["source"] == "heuristic" and r.json()["device"] == "NVIDIA H200"
    finally:
        rc, out = _stop(proc)
    assert rc == 0 and "Aborted" not in out, out  # Ctrl-C printed click's "Aborted!" and exited 1
    assert f"listening on http://127.0.0.1:{home['TUNER_PORT']}" in out and "stopped" in out, out


def test_without_a_device_the_sidecar_says_so_at_start_and_in_each_answer(home):
    """It reported ready and answered the README's curl 422, with no warning."""
    proc = _serve(home)
    try:
        r = httpx.get(f"http://127.0.0.1:{home['TUNER_PORT']}{_readme_config_query()}")
        assert r.status_code == 422, r.text
        msg = r.json()["detail"][0]["msg"]
        assert "no default device" in msg and "--device h200" in msg and "device=h200" in msg, msg
    finally:
        rc, out = _stop(proc, signal.SIGTERM)
    assert rc == 0, out
    assert "warning: no default device" in out and "tuner serve --device h200" in out, out


def test_the_sidecar_logs_its_database_going_and_coming_back(home, tmp_path):
    db = Path(home["HOME"]) / ".local" / "share" / "verify-tuner" / "configs.db"
    health = free_port()
    proc = _serve({**home, "TUNER_HEALTH_PORT": str(health)}, "--device", "h200")
    base = f"http://127.0.0.1:{home['TUNER_PORT']}"
    try:
        os.rename(db, db.with_suffix(".away"))
        eventually(lambda: httpx.get(f"{base}/readyz").status_code == 503, "ready without its file")
        time.sleep(1.0)  # gone for a while: both background checks (every 0.1 s and 0.5 s) see it
        os.rename(db.with_suffix(".away"), db)
        eventually(lambda: httpx.get(f"{base}/readyz").status_code == 200, "not ready with its file back")
        time.sleep(0.5)  # the background check's next round
    finally:
        _, out = _stop(proc)
    for line in (
        f"health probes on http://127.0.0.1:{health}",
        f"database unavailable: database file {db} is missing",
        f"not ready: database file {db} is missing",
        "database answers again",
        "ready: the database can be read and written",
    ):
        assert line in out, (line, out)
