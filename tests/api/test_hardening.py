"""Issue 11's sidecar defects, each reproduced as a user would meet it (real SQLite and
PostgreSQL through the `db_url` fixture, the real app)."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from fastapi.testclient import TestClient
from verify_tuner.api.app import create_app
from verify_tuner.buckets import bucket_of
from verify_tuner.kernels import kernel_hash
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.keys import ConfigKey
from verify_tuner.settings import Settings
from verify_tuner.store import best_configs, devices, migrate
from verify_tuner.store.session import make_engine, session_factory, session_scope

H200 = known_device("h200")
TOKEN = "hardening-token-0123"
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
    "median_us": 50.0,
}
Q = {"H": 8, "q_len": 9, "prefix": 46000}


@pytest.fixture
def client(db_url, tmp_path):
    migrate.upgrade(db_url)
    settings = Settings(database_url=db_url, device="h200", write_token=TOKEN, cache_dir=tmp_path)
    with TestClient(create_app(settings)) as c:
        yield c


def _write_elsewhere(db_url: str, *, H: int, prefix: int, nsplit: int, tuned_at: dt.datetime) -> None:
    """A write by another process (a tuner), not through this sidecar's API."""
    engine = make_engine(db_url)
    with session_scope(session_factory(engine)) as s:
        if devices.get_device(session=s, name=H200.name) is None:  # as an import does: record it once
            devices.upsert_device(session=s, limits=H200)
        key = ConfigKey(H200.name, kernel_hash(), "bf16", H, 9, bucket_of(prefix).index)
        best_configs.upsert_best(
            session=s,
            row=best_configs.BestRow(
                key, KernelConfig(nsplit=nsplit, ht=8, tk=32, block=256), median_us=50.0, tuned_at=tuned_at
            ),
        )
    engine.dispose()


def test_a_replacement_with_an_older_timestamp_is_served(client, db_url):
    """The old stamp (count, max tuned_at, max id) missed this write: served the old config forever."""
    newest = dt.datetime(2026, 11, 29, 12, tzinfo=dt.UTC)
    _write_elsewhere(db_url, H=16, prefix=46000, nsplit=33, tuned_at=newest)  # holds the newest tuned_at
    _write_elsewhere(db_url, H=8, prefix=46000, nsplit=64, tuned_at=newest - dt.timedelta(days=30))
    time.sleep(client.app.state.tables.recheck_s * 3)
    assert client.get("/config", params=Q).json()["NSPLIT"] == 64
    _write_elsewhere(db_url, H=8, prefix=46000, nsplit=128, tuned_at=newest - dt.timedelta(days=365))  # older
    time.sleep(client.app.state.tables.recheck_s * 3)
    assert client.get("/config", params=Q).json()["NSPLIT"] == 128


def test_unchanged_data_never_sends_lookups_to_the_database(client):
    def db_path() -> float:
        line = next(
            ln for ln in client.get("/metrics").text.splitlines() if ln.startswith("tuner_db_path_lookups_total")
        )
        return float(line.split()[-1])

    client.get("/config", params=Q)  # builds the table
    time.sleep(client.app.state.tables.recheck_s * 3)
    before = db_path()
    for p in (0, 1000, 46000, 1 << 20):
        assert client.get("/config", params={**Q, "prefix": p}).status_code == 200
    assert db_path() == before


@pytest.mark.parametrize(
    "query", ["H=8&H=16&q_len=9&prefix=1", "H=8&q_len=9&q_len=9&prefix=1", "H=8&q_len=9&prefix=1&prefix=2"]
)
def test_a_parameter_given_twice_is_422_naming_it(client, query):
    r = client.get(f"/config?{query}")
    name = {"H=8&H": "H", "q_len=9&q_len": "q_len"}.get(query[: len("q_len=9&q_len")], None)
    assert r.status_code == 422
    assert (
        r.json()["detail"][0]["loc"][1] in ("H", "q_len", "prefix") and "more than once" in r.json()["detail"][0]["msg"]
    )
    assert name is None or r.json()["detail"][0]["loc"][1] == name


@pytest.mark.parametrize("device", ["NVIDIA\x00H200", "h200\n", "\x7f"])
def test_control_characters_in_the_device_are_422_not_503(client, device):
    r = client.get("/config", params={**Q, "device": device})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "device"]
    assert "tuner_db_errors_total 0" in client.get("/metrics").text


def test_delete_accepts_the_short_names_get_accepts(client):
    assert client.post("/configs/import", json=[ROW], headers=AUTH).json()["imported"] == 1
    r = client.delete("/configs", params={"device": "h200"}, headers=AUTH)
    assert r.status_code == 200 and r.json() == {"deleted": 1, "plans_deleted": 0}
    assert client.get("/config", params=Q).json()["source"] == "heuristic"


@pytest.mark.parametrize(
    "params, name",
    [
        ({"device": "h200", "bucket": 9223372036854775808}, "bucket"),
        ({"device": "h200", "bucket": 10**6}, "bucket"),
        ({"device": "h200", "H": 2**63}, "H"),
        ({"device": "no-such-gpu"}, "device"),
        ({"device": "h\x00200"}, "device"),
    ],
)
def test_delete_out_of_range_or_unknown_is_422_naming_it(client, params, name):
    r = client.delete("/configs", params=params, headers=AUTH)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["query", name]


def test_get_out_of_range_integers_are_422(client):
    for params, name in (({**Q, "prefix": 2**63}, "prefix"), ({**Q, "H": 2**64}, "H"), ({**Q, "q_len": -1}, "q_len")):
        r = client.get("/config", params=params)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", name]


def test_nearest_only_within_one_octave(client):
    client.post("/configs/import", json=[ROW], headers=AUTH)  # tuned for [32768, 46341)
    near = client.get("/config", params={**Q, "prefix": 60000}).json()  # half an octave away
    assert near["source"] == "nearest" and near["NSPLIT"] == 64
    far = client.get("/config", params={**Q, "prefix": 0}).json()
    assert far["source"] == "heuristic"


def test_bearer_scheme_is_case_insensitive_and_the_token_exact(client):
    body = [ROW]
    assert client.post("/configs/import", json=body, headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200
    assert client.post("/configs/import", json=body, headers={"Authorization": f"BEARER {TOKEN}"}).status_code == 200
    for bad in (f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", TOKEN, f"Basic {TOKEN}", ""):
        assert client.post("/configs/import", json=body, headers={"Authorization": bad}).status_code == 401


def test_a_short_write_token_is_refused_at_start():
    with pytest.raises(ValueError, match="at least 16"):
        Settings(write_token="s3cret")
    with pytest.raises(ValueError, match="at least 16"):
        Settings.from_env({"TUNER_WRITE_TOKEN": "short"})


@pytest.mark.parametrize("deep", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_a_deeply_nested_import_body_is_422_not_500(client, deep):
    """json recurses per level: 100k of them was a RecursionError, a 500 to a client with the token."""
    r = client.post("/configs/import", content=deep, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert "nested too deeply" in r.json()["detail"]["errors"][0]
    assert client.get("/config", params=Q).json()["source"] == "heuristic"  # nothing stored
