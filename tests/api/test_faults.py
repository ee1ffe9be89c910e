"""Faults while serving: the database disappears, is locked or turns read-only; a writer dies
mid-import."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest
from fastapi.testclient import TestClient
from verify_tuner.api.app import create_app
from verify_tuner.settings import Settings
from verify_tuner.store import migrate

from tests.helpers import free_port, running_server, tuner_cmd

Q = {"H": 8, "q_len": 9, "prefix": 46000}
TOKEN = "fault-test-token-0123"
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


def _client(path):
    url = f"sqlite:///{path}"
    migrate.upgrade(url)
    return TestClient(create_app(Settings(database_url=url, device="h200", write_token=TOKEN)))


def test_removed_database_fails_readiness_and_never_serves_a_wrong_config(tmp_path):
    db = tmp_path / "c.db"
    with _client(db) as c:
        c.post("/configs/import", json=[ROW], headers={"Authorization": f"Bearer {TOKEN}"})
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
                k: good[k] for k in ("NSPLIT", "HT", "TK", "BLOCK")
            }
        else:
            assert "unavailable" in r.json()["detail"]


def test_unreadable_schema_serves_last_good_table_with_reason_or_503(tmp_path):
    db = tmp_path / "c.db"
    with _client(db) as c:
        c.post("/configs/import", json=[ROW], headers={"Authorization": f"Bearer {TOKEN}"})
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
        assert "tuner_db_errors_total" in c.get("/metrics").text


def test_a_worker_revalidating_its_table_during_an_outage_is_told_it_is_stale(tmp_path):
    db = tmp_path / "c.db"
    with _client(db) as c:
        c.post("/configs/import", json=[ROW], headers={"Authorization": f"Bearer {TOKEN}"})
        first = c.get("/configs", params={"H": 8, "q_len": 9})
        assert first.status_code == 200 and "X-Config-Stale" not in first.headers
        con = sqlite3.connect(db)
        con.execute("ALTER TABLE best_configs RENAME TO best_configs_gone")
        con.commit()
        con.close()
        time.sleep(c.app.state.tables.recheck_s + 0.05)
        again = c.get("/configs", params={"H": 8, "q_len": 9}, headers={"If-None-Match": first.headers["ETag"]})
        assert again.status_code == 304 and "serving the last good table" in again.headers["X-Config-Stale"]


def test_locked_database_keeps_answering(tmp_path):
    db = tmp_path / "c.db"
    with _client(db) as c:
        c.post("/configs/import", json=[ROW], headers={"Authorization": f"Bearer {TOKEN}"})
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
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.store import best_configs, devices
from verify_tuner.store.session import make_engine, session_factory, session_scope
from verify_tuner.keys import ConfigKey
sessions = session_factory(make_engine(sys.argv[1]))
h = known_device("h200")
with session_scope(sessions) as s:
    devices.upsert_device(session=s, limits=h)
for i in range(100000):
    with session_scope(sessions) as s:
        best_configs.upsert_best(session=s, row=best_configs.BestRow(ConfigKey(h.name, "k" * 16, "bf16", 1 + i // 26, 1, i % 26),
                         KernelConfig(8, 1, 32, 256), median_us=float(i + 1)))
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


# --- the database turns read-only under a running sidecar -------------------------------------

NO_OVERRIDE = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner"]


def _without_root_override(probe_file) -> list[str]:
    """A command prefix under which file modes bind this test's server: nothing for a normal
    user; for root, dropping the capabilities that let root write a 0444 file."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file modes cannot bind the server")
    # the server must still import without the override (a checkout other users cannot read would not)
    check = subprocess.run(
        [
            *NO_OVERRIDE,
            sys.executable,
            "-c",
            "import os, sys, verify_tuner.api.app; sys.exit(os.access(sys.argv[1], os.W_OK))",
            str(probe_file),
        ],
        capture_output=True,
        check=False,
    )
    if check.returncode != 0:
        pytest.skip(
            f"cannot run the server without root's file-permission override here: {check.stderr.decode()[-200:]}"
        )
    return NO_OVERRIDE


def _set_modes(db_dir, file_mode: int, dir_mode: int) -> None:
    for f in db_dir.iterdir():
        f.chmod(file_mode)
    db_dir.chmod(dir_mode)


def test_read_only_database_fails_readiness_keeps_serving_and_refuses_writes(tmp_path):
    db_dir = tmp_path / "db"
    db_dir.mkdir()
    url = f"sqlite:///{db_dir / 'c.db'}"
    migrate.upgrade(url)
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([ROW]))
    env = {"TUNER_DATABASE_URL": url, "TUNER_DEVICE": "h200", "TUNER_WRITE_TOKEN": TOKEN}
    subprocess.run(
        tuner_cmd("configs", "import", str(rows)), env={**os.environ, **env}, check=True, capture_output=True
    )
    (tmp_path / "ro").write_text("")
    (tmp_path / "ro").chmod(0o444)
    wrap = _without_root_override(tmp_path / "ro")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running_server(env, port=port, wrap=wrap):
        assert httpx.get(f"{base}/readyz").json()["database"]["writable"] is True
        assert httpx.get(f"{base}/config", params=Q).json()["NSPLIT"] == 64
        _set_modes(db_dir, 0o444, 0o555)
        try:
            ready = httpx.get(f"{base}/readyz")
            assert ready.status_code == 503 and "read-only" in ready.json()["reason"]
            assert ready.json()["database"] == {"readable": True, "writable": False, "read_only_expected": False}
            time.sleep(0.3)  # several background re-checks on the read-only file
            r = httpx.get(f"{base}/config", params=Q)
            assert r.status_code == 200 and r.json()["NSPLIT"] == 64 and r.json()["source"] == "tuned"
            w = httpx.post(
                f"{base}/configs/import", json=[{**ROW, "NSPLIT": 16}], headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert w.status_code == 503 and "readonly" in w.json()["detail"]  # the token's holder reads the detail
            assert httpx.get(f"{base}/config", params=Q).json()["NSPLIT"] == 64  # nothing half-written
        finally:
            _set_modes(db_dir, 0o644, 0o755)
        assert httpx.get(f"{base}/readyz").status_code == 200  # recovers once writable again


def test_declared_read_only_database_stays_ready(tmp_path):
    """The read-only deployment end to end: `tuner db snapshot` of a tuned database, mounted
    read-only (file and directory), served with TUNER_DATABASE_READ_ONLY."""
    src = f"sqlite:///{tmp_path / 'src.db'}"
    migrate.upgrade(src)
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([ROW]))
    subprocess.run(
        tuner_cmd("configs", "import", str(rows)),
        env={**os.environ, "TUNER_DATABASE_URL": src},
        check=True,
        capture_output=True,
    )
    db_dir = tmp_path / "db"
    db_dir.mkdir()
    subprocess.run(
        tuner_cmd("db", "snapshot", str(db_dir / "c.db")),
        env={**os.environ, "TUNER_DATABASE_URL": src},
        check=True,
        capture_output=True,
    )
    (tmp_path / "ro").write_text("")
    (tmp_path / "ro").chmod(0o444)
    wrap = _without_root_override(tmp_path / "ro")
    _set_modes(db_dir, 0o444, 0o555)
    port = free_port()
    env = {
        "TUNER_DATABASE_URL": f"sqlite:///{db_dir / 'c.db'}",
        "TUNER_DEVICE": "h200",
        "TUNER_DATABASE_READ_ONLY": "1",
    }
    try:
        with running_server(env, port=port, wrap=wrap):
            ready = httpx.get(f"http://127.0.0.1:{port}/readyz")
            assert ready.status_code == 200 and ready.json()["database"]["writable"] is False
            assert "read-only" in ready.json()["note"]
            r = httpx.get(f"http://127.0.0.1:{port}/config", params=Q).json()
            assert r["source"] == "tuned" and r["NSPLIT"] == ROW["NSPLIT"]
    finally:
        _set_modes(db_dir, 0o644, 0o755)
