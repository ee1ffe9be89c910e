"""Issue 30's sidecar items, each against a real `tuner serve` process, on SQLite and on
PostgreSQL: ambiguous query integers and unknown parameters, import bodies JSON cannot hold or
that repeat a key, text fields that would break a database or a listing, time zones."""

from __future__ import annotations

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
ROW = {"device": "NVIDIA H200", "H": 8, "q_len": 9, "prefix": 46000, "NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256}


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
        yield f"http://127.0.0.1:{port}"


def _loc(r: httpx.Response) -> list[list[object]]:
    return [d["loc"] for d in r.json()["detail"]]


# --- item 8: query integers are plain decimal digits; an unknown parameter is named --------------
@pytest.mark.parametrize("raw", ["8_0", "8.0", "+8", "%208", "8%20", "0x8", "%EF%BC%98", "1" * 25])
def test_a_query_integer_is_plain_decimal_digits(base, raw):
    r = httpx.get(f"{base}/config?H={raw}&q_len=9&prefix=46000")
    assert r.status_code == 422, r.text
    assert _loc(r) == [["query", "H"]] and "decimal digits" in r.text


def test_an_unknown_query_parameter_is_422_naming_it(base):
    r = httpx.get(f"{base}/config?H=8&q_len=9&prefix=46000&bacth=32")
    assert r.status_code == 422 and _loc(r) == [["query", "bacth"]] and "unknown parameter" in r.text
    r = httpx.get(f"{base}/configs?H=8&q_len=9&prefix=46000")  # /configs takes no prefix
    assert r.status_code == 422 and _loc(r) == [["query", "prefix"]]
    assert httpx.get(f"{base}/config?H=8&q_len=9&prefix=46000&batch=32").status_code == 200
