"""Issue 30's sidecar items, each against a real `tuner serve` process, on SQLite and on
PostgreSQL: ambiguous query integers and unknown parameters, import bodies JSON cannot hold or
that repeat a key, text fields that would break a database or a listing, time zones."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import PG_URL, reset_postgres
from tests.helpers import free_port, running_server, tuner_cmd

TOKEN = "hardening-two-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
Q_TUNED = {"q_len": 9, "prefix": 46000}
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


def _database(kind: str, tmp_path) -> str:  # type: ignore[no-untyped-def]
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'c.db'}"
    try:
        reset_postgres(PG_URL)
    except Exception as exc:  # the same rule as conftest's pg_url
        if os.environ.get("TUNER_REQUIRE_POSTGRES"):
            raise
        pytest.skip(f"PostgreSQL not reachable at {PG_URL}: {exc}")
    return PG_URL


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def base(request, tmp_path_factory) -> Iterator[str]:
    """One `tuner serve` per database kind for the module (each test cleans up what it stores)."""
    url = _database(request.param, tmp_path_factory.mktemp(request.param))
    env = {"TUNER_DATABASE_URL": url, "TUNER_DEVICE": "h200", "TUNER_WRITE_TOKEN": TOKEN}
    subprocess.run(tuner_cmd("db", "upgrade"), env={**os.environ, **env}, check=True, capture_output=True, timeout=60)
    port = free_port()
    with running_server(env, port=port):
        _URLS[f"http://127.0.0.1:{port}"] = url
        yield f"http://127.0.0.1:{port}"


_URLS: dict[str, str] = {}  # each module server's database URL, for tests that also use the CLI on it


def _server_url(base: str) -> str:
    return _URLS[base]


def _loc(r: httpx.Response) -> list[list[object]]:
    return [d["loc"] for d in r.json()["detail"]]


# --- item 8: query integers are plain decimal digits; an unknown parameter is named --------------
@pytest.mark.parametrize("raw", ["8_0", "8.0", "+8", "%208", "8%20", "0x8", "%EF%BC%98", "1" * 25])
def test_a_query_integer_is_plain_decimal_digits(base, raw):
    r = httpx.get(f"{base}/config?H={raw}&q_len=9&prefix=46000")
    assert r.status_code == 422, r.text
    assert _loc(r) == [["query", "H"]] and "decimal digits" in r.text


@pytest.mark.parametrize(("query", "name", "says"), [
    ("H=-8&q_len=9&prefix=46000", "H", "must not be negative"),
    ("H=8&q_len=9&prefix=-5", "prefix", "must not be negative"),
    ("H=8&q_len=9&prefix=46000&batch=-3", "batch", "must not be negative"),
    ("H=8&q_len=9&prefix=46000&device=", "device", "at least 1 character"),
])  # fmt: skip
def test_a_negative_integer_or_an_empty_device_is_told_so(base, query, name, says):
    """A negative H was told "must be plain decimal digits", an empty device shown a regex."""
    r = httpx.get(f"{base}/config?{query}")
    assert r.status_code == 422 and _loc(r) == [["query", name]] and says in r.json()["detail"][0]["msg"], r.text


def test_an_unknown_query_parameter_is_422_naming_it(base):
    r = httpx.get(f"{base}/config?H=8&q_len=9&prefix=46000&bacth=32")
    assert r.status_code == 422 and _loc(r) == [["query", "bacth"]] and "unknown parameter" in r.text
    r = httpx.get(f"{base}/configs?H=8&q_len=9&prefix=46000")  # /configs takes no prefix
    assert r.status_code == 422 and _loc(r) == [["query", "prefix"]]
    assert httpx.get(f"{base}/config?H=8&q_len=9&prefix=46000&batch=32").status_code == 200


# --- items 5 and 9: import bodies JSON cannot hold, or that say one thing twice ---------------
@pytest.mark.parametrize(
    "body, says",
    [
        ("[NaN]", "list of objects"),
        ("[1, NaN]", "list of objects"),
        ('{"x": 1e999}', "list of objects"),
        (json.dumps([ROW])[:-2] + ', "median_us": NaN}]', "row 1: median_us: must be a finite number > 0, got nan"),
        (json.dumps([ROW])[:-2] + ', "p90_us": 1e999}]', "row 1: p90_us: must be a finite number > 0, got inf"),
        (json.dumps([ROW])[:-2] + ', "NSPLIT": -Infinity}]', "'NSPLIT'"),  # a repeated key, named
        ("[" + "9" * 5000 + "]", "digits"),
        (json.dumps([ROW])[:-2] + ', "H": 16}]', "duplicate key 'H'"),  # last-wins stored H=16
        (b'[{"device": "NVIDIA \xff"}]', "not UTF-8"),
    ],
)
def test_an_import_body_json_cannot_hold_is_422_naming_it(base, body, says):
    """Non-finite numbers were a 500 with a traceback (the 422 handler echoed them); a repeated key was last-wins."""
    r = httpx.post(f"{base}/configs/import", content=body, headers=AUTH)
    assert r.status_code == 422, r.text
    assert says in r.json()["detail"]["errors"][0] and "nothing stored" in r.json()["detail"]["msg"]
    assert httpx.get(f"{base}/config", params={"H": 16, "q_len": 9, "prefix": 46000}).json()["source"] == "heuristic"
    assert httpx.get(f"{base}/config", params={"H": 8, "q_len": 9, "prefix": 46000}).json()["source"] == "heuristic"


def test_a_csv_header_with_a_repeated_column_is_rejected_naming_it(base, tmp_path):
    url = {"TUNER_DATABASE_URL": _server_url(base)}
    (tmp_path / "rows.csv").write_text(
        "device,H,q_len,prefix,NSPLIT,HT,TK,BLOCK,H\nNVIDIA H200,8,9,46000,64,8,32,256,16\n"
    )
    out = subprocess.run(
        tuner_cmd("configs", "import", str(tmp_path / "rows.csv")),
        check=False,
        env={**os.environ, **url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "repeats column(s) 'H'" in out.stderr, out.stderr
    assert httpx.get(f"{base}/config", params={"H": 16, "q_len": 9, "prefix": 46000}).json()["source"] == "heuristic"


# --- item 6: one character set for text fields; no SQL in error bodies ---------------------------
@pytest.mark.parametrize("field", ["kernel_hash", "device"])
@pytest.mark.parametrize("bad", ["ab\x00cd", "abcd\n", "ab\rcd", "ab\tcd"])
def test_a_control_character_in_a_text_field_is_422_on_every_database(base, field, bad):
    """PostgreSQL answered a NUL with a 503 quoting the SQL; SQLite stored it; a newline broke listings."""
    r = httpx.post(f"{base}/configs/import", json=[{**ROW, "H": 16, field: bad}], headers=AUTH)
    assert r.status_code == 422, r.text
    assert f"row 1: {field}: must not contain control characters" in r.json()["detail"]["errors"][0]
    assert httpx.get(f"{base}/config", params={"H": 16, "q_len": 9, "prefix": 46000}).json()["source"] == "heuristic"


SQL_WORDS = ("SELECT", "INSERT", "UPDATE", "[SQL", "parameters:", "FROM ")


def test_a_database_error_body_holds_no_sql(base):
    """A table gone behind the sidecar's back: the 503 says why, without the statement or its values."""
    from sqlalchemy import create_engine, text

    engine = create_engine(_server_url(base))
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE best_configs RENAME TO best_configs_away"))
    try:
        r = httpx.post(f"{base}/configs/import", json=[{**ROW, "H": 16}], headers=AUTH)
        assert r.status_code == 503 and "best_configs" in r.text, r.text
        assert not [w for w in SQL_WORDS if w in r.text], r.text
    finally:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE best_configs_away RENAME TO best_configs"))
        engine.dispose()


# --- item 7: UTC on every database ------------------------------------------------------------------
def test_an_offset_timestamp_is_stored_and_served_as_utc(base):
    """SQLite served 2026-06-01T12:00:00+05:00 as 12:00:00; PostgreSQL as 07:00:00Z."""
    row = {**ROW, "H": 32, "tuned_at": "2026-06-01T12:00:00+05:00"}
    assert httpx.post(f"{base}/configs/import", json=[row], headers=AUTH).status_code == 200
    try:
        r = httpx.get(f"{base}/config", params={**Q_TUNED, "H": 32})
        got = r.json()
        assert r.status_code == 200 and got["source"] == "tuned", (r.status_code, r.headers, got)
        served = dt.datetime.fromisoformat(got["tuned_at"])
        assert served == dt.datetime(2026, 6, 1, 7, tzinfo=dt.UTC) and served.utcoffset() == dt.timedelta(0), got
    finally:
        httpx.delete(f"{base}/configs", params={"device": "h200", "H": 32}, headers=AUTH)
