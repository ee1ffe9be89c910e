"""/readyz says ready only when the database can be used as the sidecar uses it: it said ready
with PostgreSQL's best_configs renamed away (every uncached lookup a 503 UndefinedTable), and with
the SQLite file's -wal made unwritable (imports "disk I/O error", /readyz "writable"). Real
`tuner serve` processes; the readiness thread probes every 0.5 s."""

from __future__ import annotations

import json
import os
import subprocess

import httpx
import pytest
import sqlalchemy as sa

from tests.helpers import eventually, file_modes_bind, free_port, running_server, tuner_cmd

Q = {"H": 8, "q_len": 9, "prefix": 46000}
ROW = {"device": "h200", "H": 8, "q_len": 9, "prefix": 46000, "NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256}
ROW |= {"STAGES": 2, "QT": 0, "WR": 2, "WK": 4, "SF": 0, "PIPE": 1}


def _tuned(url: str, tmp_path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    env = {"TUNER_DATABASE_URL": url, "TUNER_DEVICE": "h200"}
    (tmp_path / "row.json").write_text(json.dumps([ROW]))
    for args in (("db", "upgrade"), ("configs", "import", str(tmp_path / "row.json"))):
        subprocess.run(tuner_cmd(*args), env={**os.environ, **env}, check=True, capture_output=True, timeout=60)
    return env


def test_a_renamed_table_is_not_ready(pg_url, tmp_path):
    env = _tuned(pg_url, tmp_path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    engine = sa.create_engine(pg_url)
    with running_server(env, port=port):
        assert httpx.get(f"{base}/readyz").status_code == 200
        with engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE best_configs RENAME TO best_configs_away"))
        try:
            assert httpx.get(f"{base}/config", params={**Q, "H": 16}).status_code == 503  # what requests meet
            ready = eventually(
                lambda: (r := httpx.get(f"{base}/readyz")).status_code == 503 and r, "ready without best_configs"
            )
            body = ready.json()
            assert body["database"]["readable"] is False, body
            # the body answers without a token: no driver names, no URL, no SQL
            assert not any(s in ready.text for s in ("UndefinedTable", "psycopg", "postgres@", "sqlalche.me")), body
        finally:
            with engine.begin() as conn:
                conn.execute(sa.text("ALTER TABLE best_configs_away RENAME TO best_configs"))
        eventually(lambda: httpx.get(f"{base}/readyz").status_code == 200, "not ready again once the table is back")
    engine.dispose()


def test_an_unwritable_wal_is_not_ready(tmp_path):
    wrap = file_modes_bind()
    if wrap is None:
        pytest.fail("root without setpriv: file modes cannot bind the server here")
    db = tmp_path / "db" / "configs.db"
    env = _tuned(f"sqlite:///{db}", tmp_path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running_server(env, port=port, wrap=wrap):
        assert httpx.get(f"{base}/readyz").status_code == 200
        wal = db.with_name("configs.db-wal")
        assert wal.exists()  # the import switched the file to WAL
        wal.chmod(0o444)  # as `chattr +i` makes it for every user: writes fail, the file stays
        try:
            ready = eventually(lambda: (r := httpx.get(f"{base}/readyz")).status_code == 503 and r, "ready")
            assert ready.json()["database"] == {"readable": True, "writable": False, "read_only_expected": False}
            assert "read-only" in ready.json()["reason"] and str(tmp_path) not in ready.text, ready.text
        finally:
            wal.chmod(0o644)
        eventually(lambda: httpx.get(f"{base}/readyz").status_code == 200, "not ready once writable again")
