"""Faults while serving: the database disappears or is locked; a writer dies mid-import."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

from fastapi.testclient import TestClient

from api.app import create_app
from tuner.db import migrate
from tuner.settings import Settings

Q = {"H": 8, "q_len": 9, "prefix": 46000}
ROW = {"device": "NVIDIA H200", "H": 8, "q_len": 9, "prefix": 46000, "NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256}


def _client(path):
    url = f"sqlite:///{path}"
    migrate.upgrade(url)
    return TestClient(create_app(Settings(database_url=url, device="h200", write_token="t")))


def test_removed_database_fails_readiness_and_never_serves_a_wrong_config(tmp_path):
    db = tmp_path / "c.db"
    with _client(db) as c:
        c.post("/configs/import", json=[ROW], headers={"Authorization": "Bearer t"})
        good = c.get("/config", params=Q).json()
        assert good["source"] == "tuned"
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(f"{db}{suffix}"):
                os.remove(f"{db}{suffix}")
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "missing" in ready.json()["reason"]
        r = c.get("/config", params=Q)
        assert r.status_code in (200, 503)
        if r.status_code == 200:  # only ever the last good answer
            assert {k: r.json()[k] for k in ("NSPLIT", "HT", "TK", "BLOCK")} == {
                k: good[k] for k in ("NSPLIT", "HT", "TK", "BLOCK")}
        else:
            assert "unavailable" in r.json()["detail"]


def test_unreadable_schema_serves_last_good_table_with_reason_or_503(tmp_path):
    db = tmp_path / "c.db"
    with _client(db) as c:
        c.post("/configs/import", json=[ROW], headers={"Authorization": "Bearer t"})
        good = c.get("/config", params=Q).json()
        con = sqlite3.connect(db)
        con.execute("ALTER TABLE best_configs RENAME TO best_configs_gone")  # reads now fail
        con.commit()
        con.close()
        time.sleep(c.app.state.tables.recheck_s + 0.05)  # past the cache's re-check window
        r = c.get("/config", params=Q)
        assert r.status_code == 200 and "X-Config-Stale" in r.headers
        assert r.json()["NSPLIT"] == good["NSPLIT"]
        cold = c.get("/config", params={**Q, "H": 16})  # never served before: nothing good to fall back on
        assert cold.status_code == 503 and "unavailable" in cold.json()["detail"]
        assert 'tuner_db_errors_total' in c.get("/metrics").text


def test_locked_database_keeps_answering(tmp_path):
    db = tmp_path / "c.db"
    with _client(db) as c:
        c.post("/configs/import", json=[ROW], headers={"Authorization": "Bearer t"})
        locker = sqlite3.connect(db, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        locker.execute("UPDATE best_configs SET nsplit = 999")  # uncommitted
        try:
            t0 = time.perf_counter()
            r = c.get("/config", params=Q)
            assert r.status_code == 200 and r.json()["NSPLIT"] == 64  # WAL readers see the committed row
            assert time.perf_counter() - t0 < 2
        finally:
            locker.execute("ROLLBACK")
            locker.close()


WRITER = """
import sys
from kernels.config import KernelConfig
from kernels.limits import known_device
from tuner.db import repo
from tuner.db.session import make_engine, session_factory, session_scope
from tuner.workload import WorkloadKey
sessions = session_factory(make_engine(sys.argv[1]))
h = known_device("h200")
with session_scope(sessions) as s:
    repo.upsert_device(session=s, limits=h)
for i in range(100000):
    with session_scope(sessions) as s:
        repo.upsert_best(session=s, key=WorkloadKey(h.name, "k" * 16, "bf16", 1 + i // 26, 1, i % 26),
                         config=KernelConfig(8, 1, 32, 256), median_us=float(i + 1))
    print(i, flush=True)
"""


def test_writer_killed_mid_import_loses_nothing_committed(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    migrate.upgrade(url)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, url], stdout=subprocess.PIPE, text=True)
    committed = -1
    for line in proc.stdout:
        committed = int(line)
        if committed >= 60:
            break
    proc.kill()  # SIGKILL, mid-transaction
    proc.wait()
    con = sqlite3.connect(tmp_path / "c.db")
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    n = con.execute("SELECT count(*) FROM best_configs").fetchone()[0]
    con.close()
    assert n >= committed + 1, f"{committed + 1} commits acknowledged, {n} rows survived"
