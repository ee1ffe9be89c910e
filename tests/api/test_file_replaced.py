"""Issue 30 item 1: the SQLite file is deleted under a running `tuner serve`, then made anew
(`tuner db upgrade` and an import). The sidecar must not recreate the deleted file through an
import, must say it is not ready while the path is empty, and must then serve, and import into,
the file at its path, not the deleted one it still held open."""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx

from tests.helpers import eventually, free_port, running_server, tuner_cmd

TOKEN = "file-replaced-token-0123"
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


def test_a_deleted_then_recreated_file_is_followed(tmp_path):
    db = tmp_path / "configs.db"
    env = {"TUNER_DATABASE_URL": f"sqlite:///{db}", "TUNER_DEVICE": "h200", "TUNER_WRITE_TOKEN": TOKEN}
    full = {**os.environ, **env}
    subprocess.run(tuner_cmd("db", "upgrade"), env=full, check=True, capture_output=True, timeout=60)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running_server(env, port=port):
        assert httpx.post(f"{base}/configs/import", json=[ROW], headers=AUTH).json()["imported"] == 1
        assert httpx.get(f"{base}/config", params=Q).json()["NSPLIT"] == 64
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(f"{db}{suffix}"):
                os.remove(f"{db}{suffix}")

        time.sleep(0.3)  # a few background checks
        w = httpx.post(f"{base}/configs/import", json=[{**ROW, "H": 16}], headers=AUTH)
        assert w.status_code == 503 and "missing" in w.json()["detail"], w.text
        assert not db.exists(), "an import recreated the deleted database file"
        assert httpx.get(f"{base}/readyz").status_code == 503
        stale = httpx.get(f"{base}/config", params=Q)
        assert stale.status_code == 200 and "missing" in stale.headers["X-Config-Stale"]

        subprocess.run(tuner_cmd("db", "upgrade"), env=full, check=True, capture_output=True, timeout=60)
        (tmp_path / "new.json").write_text(json.dumps([{**ROW, "NSPLIT": 32}]))
        subprocess.run(
            tuner_cmd("configs", "import", str(tmp_path / "new.json")), env=full, check=True, capture_output=True
        )
        eventually(lambda: httpx.get(f"{base}/readyz").status_code == 200, "not ready on the new file")
        r = eventually(
            lambda: (x := httpx.get(f"{base}/config", params=Q)).json()["NSPLIT"] == 32 and x,
            "still serving the deleted file's rows",
        )
        assert "X-Config-Stale" not in r.headers

        imp = httpx.post(f"{base}/configs/import", json=[{**ROW, "H": 16, "NSPLIT": 16}], headers=AUTH)
        assert imp.status_code == 200 and imp.json()["imported"] == 1
        got = httpx.get(f"{base}/config", params={**Q, "H": 16}).json()
        assert (got["source"], got["NSPLIT"]) == ("tuned", 16), "the API import went somewhere /config does not read"


def _snapshot(tmp_path, name: str, nsplit: int):  # type: ignore[no-untyped-def]
    """A `tuner db snapshot` of a database holding ROW with `nsplit`."""
    env = {**os.environ, "TUNER_DATABASE_URL": f"sqlite:///{tmp_path / (name + '.src.db')}", "TUNER_DEVICE": "h200"}
    (tmp_path / f"{name}.json").write_text(json.dumps([{**ROW, "NSPLIT": nsplit}]))
    for args in (("db", "upgrade"), ("configs", "import", str(tmp_path / f"{name}.json"))):
        subprocess.run(tuner_cmd(*args), env=env, check=True, capture_output=True, timeout=60)
    subprocess.run(
        tuner_cmd("db", "snapshot", str(tmp_path / f"{name}.db")), env=env, check=True, capture_output=True, timeout=60
    )
    return tmp_path / f"{name}.db"


def test_a_file_rewritten_in_place_is_served_anew(tmp_path):
    """`cp new-snapshot.db live.db` keeps the inode, and two snapshots of the same shape carry the
    same data stamp: the sidecar served the old configs for ever, ready and without a stale header."""
    from verify_tuner.store import data_version
    from verify_tuner.store.session import make_engine, session_factory, session_scope

    old, new = _snapshot(tmp_path, "old", 64), _snapshot(tmp_path, "new", 32)
    stamps = []
    for path in (old, new):
        engine = make_engine(f"sqlite:///{path}", create=False)
        with session_scope(session_factory(engine)) as s:
            stamps.append(data_version.data_stamp(session=s))
        engine.dispose()
    assert stamps[0] == stamps[1]  # what makes this case: the data stamp alone cannot tell them apart
    live = tmp_path / "live.db"
    live.write_bytes(old.read_bytes())
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running_server({"TUNER_DATABASE_URL": f"sqlite:///{live}", "TUNER_DEVICE": "h200"}, port=port):
        assert httpx.get(f"{base}/config", params=Q).json()["NSPLIT"] == 64
        inode = live.stat().st_ino
        with open(live, "r+b") as f:  # as cp does: the same file, truncated and written
            f.truncate(0)
            f.write(new.read_bytes())
        assert live.stat().st_ino == inode
        r = eventually(lambda: (x := httpx.get(f"{base}/config", params=Q)).json()["NSPLIT"] == 32 and x, "old config")
        assert r.json()["source"] == "tuned" and "X-Config-Stale" not in r.headers
        assert httpx.get(f"{base}/readyz").status_code == 200


def test_a_swapped_file_is_served_anew_after_a_rejected_import(tmp_path):
    """`cp new.db tmp && mv tmp live.db`, then an authorized import rejected within ~100 ms: the
    import's own file check reset the pools but not the cached tables, and the background check,
    seeing no change left and the same data stamp, served the old configs for ever (8 of 10 runs)."""
    snaps = {64: _snapshot(tmp_path, "a", 64), 32: _snapshot(tmp_path, "b", 32)}
    live = tmp_path / "live.db"
    live.write_bytes(snaps[64].read_bytes())
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {"TUNER_DATABASE_URL": f"sqlite:///{live}", "TUNER_DEVICE": "h200", "TUNER_WRITE_TOKEN": TOKEN}
    with running_server(env, port=port):
        served = httpx.get(f"{base}/config", params=Q).json()["NSPLIT"]
        assert served == 64
        for nsplit in (32, 64, 32, 64, 32):  # each swap races the background check; one lost race is the bug
            tmp = tmp_path / "swap.tmp"
            tmp.write_bytes(snaps[nsplit].read_bytes())
            os.replace(tmp, live)
            bad = httpx.post(f"{base}/configs/import", json=[{**ROW, "device": "no-such-gpu"}], headers=AUTH)
            assert bad.status_code == 422, bad.text
            eventually(
                lambda n=nsplit: httpx.get(f"{base}/config", params=Q).json()["NSPLIT"] == n,
                f"still serving the replaced file's NSPLIT after swapping in {nsplit}",
                within_s=3.0,
            )
