"""An import over HTTP is stored whole within its deadline, or not at all and the answer says so:
its worker thread, abandoned at the deadline, once committed anyway 60-70 s later (a client that
retried imported twice; one that gave up believed nothing was written). Real `tuner serve`
processes on real SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time

import httpx
import pytest
from sqlalchemy.engine import make_url
from verify_tuner import batches, buckets
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.limits import known_device

from tests.helpers import free_port, running_server, tuner_cmd
from tests.stall_proxy import stalling_proxy

TOKEN = "import-deadline-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: TUNER_DB_TIMEOUT_S for the deadline tests: the import's deadline is 12 of them (6 s)
DB_TIMEOUT_S = 0.5
IMPORT_DEADLINE_S = 12 * DB_TIMEOUT_S


def _rows(n: int) -> list[dict]:
    """`n` valid rows of distinct keys (the heuristic's config for each H and q_len, as tuned)."""
    h200 = known_device("h200")
    out: list[dict] = []
    for H in (8, 16, 32, 64, 4, 2, 1, 128):
        for q_len in range(1, 65):
            cfg = heuristic_config(h200, H=H, q_len=q_len, prefix=46000).as_params()
            for bucket in range(len(buckets.ALL)):
                for batch_bucket in range(len(batches.ALL)):
                    if len(out) == n:
                        return out
                    key = {"H": H, "q_len": q_len, "bucket": bucket, "batch_bucket": batch_bucket}
                    out.append({"device": "NVIDIA H200", **key, **cfg, "median_us": 40.0 + len(out) % 7})
    raise AssertionError(f"fewer than {n} keys")


def _stored(url: str) -> int:
    r = subprocess.run(
        tuner_cmd("configs", "list", "--json"),
        env={**os.environ, "TUNER_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return len(json.loads(r.stdout))


def _upgrade(url: str) -> None:
    env = {**os.environ, "TUNER_DATABASE_URL": url}
    subprocess.run(tuner_cmd("db", "upgrade"), env=env, check=True, capture_output=True, timeout=60)


def _serve(url: str, **extra: str):  # type: ignore[no-untyped-def]
    port = free_port()
    env = {"TUNER_DATABASE_URL": url, "TUNER_DEVICE": "h200", "TUNER_WRITE_TOKEN": TOKEN, **extra}
    return f"http://127.0.0.1:{port}", running_server(env, port=port)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_30000_rows_import_within_the_deadline(backend, tmp_path, request):
    """~7.8 MB, under the 16 MiB body cap: ~4.3 ms a row made it a 503 at 60 s, stored 60-70 s later."""
    url = f"sqlite:///{tmp_path / 'configs.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    _upgrade(url)
    body = json.dumps(_rows(30_000)).encode()
    base, server = _serve(url)
    with server:
        t0 = time.monotonic()
        r = httpx.post(f"{base}/configs/import", content=body, headers=AUTH, timeout=120)
        took = time.monotonic() - t0
        assert r.status_code == 200 and r.json()["imported"] == 30_000, r.text[:300]
        assert took < 60, f"{took:.1f} s: at the deadline's edge"
        got = httpx.get(f"{base}/config", params={"H": 16, "q_len": 9, "prefix": 46000, "batch": 8}).json()
        assert got["source"] == "tuned"
    assert _stored(url) == 30_000


def test_an_import_past_its_deadline_is_rolled_back_on_sqlite(tmp_path):
    """Another writer holds SQLite's write lock past the import's deadline, then lets go: the import,
    answered 503, must not commit once the lock is free."""
    db = tmp_path / "configs.db"
    url = f"sqlite:///{db}"
    _upgrade(url)
    base, server = _serve(url, TUNER_DB_TIMEOUT_S=str(DB_TIMEOUT_S))
    with server:
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # the import waits on its busy timeout (30 s), past its deadline
        try:
            t0 = time.monotonic()
            r = httpx.post(f"{base}/configs/import", json=_rows(50), headers=AUTH, timeout=60)
            took = time.monotonic() - t0
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert r.status_code == 503 and "rolled back, nothing stored" in r.json()["detail"], r.text
        assert IMPORT_DEADLINE_S <= took < IMPORT_DEADLINE_S + 3
        time.sleep(2)  # the abandoned thread gets the lock now, runs, and must roll back
        assert httpx.get(f"{base}/config", params={"H": 8, "q_len": 1, "prefix": 0}).json()["source"] == "heuristic"
    assert _stored(url) == 0


def test_an_import_past_its_deadline_is_rolled_back_on_postgresql(pg_url):
    """The database stops answering mid-import (a stalled network path) and answers again after the
    503: the statements it then runs are rolled back, not committed."""
    real = make_url(pg_url)
    _upgrade(pg_url)
    with stalling_proxy((real.host or "127.0.0.1", real.port or 5432)) as proxy:
        url = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        base, server = _serve(url, TUNER_DB_TIMEOUT_S=str(DB_TIMEOUT_S))
        with server:
            warm = {
                **_rows(1)[0],
                "q_len": 9,
                **heuristic_config(known_device("h200"), H=8, q_len=9, prefix=0).as_params(),
            }
            assert httpx.post(f"{base}/configs/import", json=[warm], headers=AUTH).status_code == 200  # a pooled writer
            proxy.stall()
            t0 = time.monotonic()
            r = httpx.post(f"{base}/configs/import", json=_rows(50), headers=AUTH, timeout=60)
            took = time.monotonic() - t0
            proxy.resume()
            assert r.status_code == 503 and "rolled back, nothing stored" in r.json()["detail"], r.text
            assert IMPORT_DEADLINE_S <= took < IMPORT_DEADLINE_S + 3
            time.sleep(3)  # what the thread sent during the stall now runs; its commit must not follow
    assert _stored(pg_url) == 1  # the first import only
