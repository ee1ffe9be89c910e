"""What a client without a token learns from the sidecar's answers: a failure's kind, never the
deployment (the SQLite path, PostgreSQL's user, host, port and database, driver exception names,
SQLAlchemy's links), which goes to the sidecar's log instead; and no redirect built from the
request's Host header. A real `tuner serve` with its health port, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from tests.helpers import eventually, free_port, running_server, tuner_cmd

Q = {"H": 8, "q_len": 9, "prefix": 46000}
ROW = {"device": "h200", "H": 8, "q_len": 9, "prefix": 46000, "NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256}
ROW |= {"STAGES": 2, "QT": 0, "WR": 2, "WK": 4, "SF": 0, "PIPE": 1}
LEAKS = ("Error:", "psycopg", "sqlalche.me", "sqlite3", "Traceback")


def _start(url: str, tmp_path):  # type: ignore[no-untyped-def]
    env = {"TUNER_DATABASE_URL": url, "TUNER_DEVICE": "h200"}
    (tmp_path / "row.json").write_text(json.dumps([ROW]))
    for args in (("db", "upgrade"), ("configs", "import", str(tmp_path / "row.json"))):
        subprocess.run(tuner_cmd(*args), env={**os.environ, **env}, check=True, capture_output=True, timeout=60)
    port, health = free_port(), free_port()
    return port, health, running_server({**env, "TUNER_HEALTH_PORT": str(health)}, port=port)


def _answers(port: int, health: int) -> list[httpx.Response]:
    main = f"http://127.0.0.1:{port}"
    return [
        httpx.get(f"{main}/readyz"),
        httpx.get(f"http://127.0.0.1:{health}/readyz"),
        httpx.get(f"{main}/config", params={**Q, "H": 16}),  # never cached: a 503
        httpx.get(f"{main}/config", params=Q),  # cached: served stale, with the reason in a header
    ]


def _shows(r: httpx.Response, secrets: tuple[str, ...]) -> list[str]:
    text = r.text + json.dumps(dict(r.headers))
    return [s for s in (*secrets, *LEAKS) if s in text]


def test_a_missing_sqlite_file_is_named_only_in_the_log(tmp_path):
    db = tmp_path / "deployment-secret-dir" / "configs.db"
    port, health, server = _start(f"sqlite:///{db}", tmp_path)
    with server as proc:
        assert httpx.get(f"http://127.0.0.1:{port}/config", params=Q).status_code == 200
        os.rename(db, db.with_suffix(".away"))
        eventually(lambda: httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 503, "ready")
        cached = f"http://127.0.0.1:{port}/config"  # the background check has seen it (/readyz sees it at once)
        eventually(lambda: "X-Config-Stale" in httpx.get(cached, params=Q).headers, "no stale header")
        answers = _answers(port, health)
        assert [r.status_code for r in answers] == [503, 503, 503, 200]
        for r in answers:
            assert not _shows(r, (str(tmp_path), "deployment-secret-dir", "configs.db")), (r.text, r.headers)
        assert answers[0].json()["reason"] == "the database file is missing"
        assert "the database file is missing" in answers[3].headers["X-Config-Stale"]
        proc.terminate()
        log = proc.communicate(timeout=10)[0]
    assert f"database file {db} is missing" in log, log  # the operator reads the path in the log


def test_a_postgresql_failure_names_no_user_host_or_database(pg_url, tmp_path):
    url = make_url(pg_url)
    port, health, server = _start(pg_url, tmp_path)
    engine = sa.create_engine(pg_url)
    with server:
        with engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE devices RENAME TO devices_away"))
        try:
            eventually(lambda: httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 503, "ready")
            secrets = (f"{url.username}@", str(url.database), "UndefinedTable", "devices_away", "relation")
            for r in _answers(port, health)[:3]:
                assert r.status_code == 503 and not _shows(r, secrets), (r.text, r.headers)
        finally:
            with engine.begin() as conn:
                conn.execute(sa.text("ALTER TABLE devices_away RENAME TO devices"))
    engine.dispose()


def test_no_redirect_reflects_the_host_header_and_no_page_needs_a_cdn(tmp_path):
    port, _, server = _start(f"sqlite:///{tmp_path / 'c.db'}", tmp_path)
    with server:
        base = f"http://127.0.0.1:{port}"
        r = httpx.get(f"{base}/config/", params=Q, headers={"Host": "evil.example"})
        assert r.status_code == 404 and "location" not in r.headers, r.headers
        assert httpx.get(f"{base}/docs").status_code == 404  # Swagger's page loads its script from a CDN
        assert "/config" in httpx.get(f"{base}/openapi.json").json()["paths"]
        time.sleep(0.1)
        metrics = httpx.get(f"{base}/metrics").text
        assert 'route="/openapi.json"' in metrics
