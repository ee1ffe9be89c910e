"""Issue 30 item 2: PostgreSQL stops answering (a loopback proxy stops forwarding, every
connection stays open) under a running `tuner serve`. Every database call is bounded: /readyz
turns 503 within a probe interval and the deadline (answering at once throughout), served keys keep their last good table marked stale, other keys and imports are 503s,
and `tuner db current` / `tuner serve` give up instead of hanging; all recover when it answers."""

from __future__ import annotations

import os
import subprocess
import time

import httpx
import pytest
from sqlalchemy.engine import make_url
from verify_tuner.api.readiness import EVERY_S

from tests.helpers import free_port, running_server, tuner_cmd
from tests.stall_proxy import stalling_proxy

TOKEN = "database-hang-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROW = {
    "device": "NVIDIA H200",
    "H": 8,
    "q_len": 9,
    "prefix": 46000,
    "NSPLIT": 64,
    "HT": 8,
    "TK": 32,
    "BLOCK": 256,
    "STAGES": 2,
    "QT": 0,
    "WR": 2,
    "WK": 4,
    "SF": 0,
    "PIPE": 1,
}
Q = {"H": 8, "q_len": 9, "prefix": 46000}
DEADLINE_S = 0.5


def _timed(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def _not_ready_within(base: str, seconds: float) -> httpx.Response:
    """/readyz answers at once from the readiness thread's record, which turns to 503 within a
    probe interval and a deadline of the database's going quiet."""
    deadline = time.monotonic() + seconds
    while True:
        ready, took = _timed(httpx.get, f"{base}/readyz", timeout=30)
        assert took < 3 * DEADLINE_S, f"/readyz waited {took:.2f} s: it must answer from its record"
        if ready.status_code == 503 or time.monotonic() > deadline:
            return ready
        time.sleep(0.05)


def _cli_gives_up(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        tuner_cmd(*args), env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_database_that_stops_answering_is_an_outage_not_a_hang(pg_url):
    real = make_url(pg_url)
    with stalling_proxy((real.host or "127.0.0.1", real.port or 5432)) as proxy:
        url = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        env = {"TUNER_DATABASE_URL": url, "TUNER_DEVICE": "h200", "TUNER_WRITE_TOKEN": TOKEN}
        subprocess.run(tuner_cmd("db", "upgrade"), env={**os.environ, **env}, check=True, capture_output=True)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        with running_server({**env, "TUNER_DB_TIMEOUT_S": str(DEADLINE_S)}, port=port):
            assert httpx.post(f"{base}/configs/import", json=[ROW], headers=AUTH).status_code == 200
            assert httpx.get(f"{base}/config", params=Q).json()["source"] == "tuned"
            proxy.stall()
            cli = [_cli_gives_up(env, "db", "current"), _cli_gives_up({**env, "TUNER_PORT": str(free_port())}, "serve")]

            ready = _not_ready_within(base, EVERY_S + 2 * DEADLINE_S)
            assert ready.status_code == 503 and "did not answer" in ready.json()["reason"], ready.text
            served, took = _timed(httpx.get, f"{base}/config", params=Q, timeout=30)
            assert served.status_code == 200 and served.json()["NSPLIT"] == 64 and took < 3 * DEADLINE_S
            assert "did not answer" in served.headers["X-Config-Stale"]
            cold, took = _timed(httpx.get, f"{base}/config", params={**Q, "H": 16}, timeout=30)
            assert cold.status_code == 503 and "unavailable" in cold.json()["detail"] and took < 3 * DEADLINE_S
            imp, took = _timed(httpx.post, f"{base}/configs/import", json=[{**ROW, "H": 16}], headers=AUTH, timeout=60)
            assert imp.status_code == 503 and "did not answer" in imp.json()["detail"] and took < 15, (imp.text, took)

            for proc in cli:  # libpq's connect timeout: they give up, not hang
                _, err = proc.communicate(timeout=30)
                assert proc.returncode != 0 and "timeout" in err.lower(), err

            proxy.resume()
            deadline = time.monotonic() + 20
            while httpx.get(f"{base}/readyz", timeout=30).status_code != 200:
                assert time.monotonic() < deadline, "no recovery once the database answers again"
                time.sleep(0.2)
            r = httpx.get(f"{base}/config", params=Q)
            while "X-Config-Stale" in r.headers and time.monotonic() < deadline:
                time.sleep(0.2)
                r = httpx.get(f"{base}/config", params=Q)
            assert r.status_code == 200 and "X-Config-Stale" not in r.headers and r.json()["NSPLIT"] == 64


@pytest.fixture(autouse=True)
def _bounded():  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    yield
    assert time.monotonic() - t0 < 120, "the hang test itself must stay bounded"
