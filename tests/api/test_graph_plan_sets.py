"""Graph plan sets as the sidecar, `tuner configs show` and `tuner configs dump` serve them, on
SQLite and PostgreSQL: GET /config answers the range holding the request's prefix with where the
set's other ranges start, GET /configs and the engine file every range of each batch bucket's set,
and a worker of the release before ranges still reads them (one plan a batch bucket: the last)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from verify_tuner import engine_files
from verify_tuner.api.app import create_app
from verify_tuner.cli.commands import cli
from verify_tuner.kernels import kernel_hash
from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.keys import TableKey
from verify_tuner.settings import Settings
from verify_tuner.store import devices, migrate, plans
from verify_tuner.store.session import make_engine, session_factory, session_scope

H200 = known_device("h200")
SHORT = KernelConfig(nsplit=24, ht=8, tk=32, block=256, qt=2)
LONG = KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3)
#: B=1's set over prefix buckets 0..18 (0..131072): SHORT below bucket 9 (4096 tokens), LONG from there
WHOLE = plans.PlanRow(
    table=TableKey(H200.name, kernel_hash(), "bf16", 8, 9),
    batch_bucket=0,
    bucket_lo=0,
    bucket_hi=18,
    range_lo=0,
    range_hi=8,
    weights_digest="d" * 64,
    weights={"source": "equal", "outside": 0.0, "buckets": {}},
    config=SHORT,
    expected_us=10.0,
    per_bucket=[{"bucket": b, "prefix": 100, "weight": 1 / 19, "us": 10.0, "best_us": 9.5, "regret": 10 / 9.5}
                for b in range(9)],
    measured_by="a test",
    max_graphs=2,
    min_saving=0.02,
    by_count=[30.0, 28.0],
)  # fmt: skip
SET = [
    WHOLE,
    replace(
        WHOLE,
        range_lo=9,
        range_hi=18,
        config=LONG,
        expected_us=50.0,
        per_bucket=[{"bucket": b, "us": 50.0, "best_us": 49.0, "regret": 50 / 49} for b in range(9, 19)],
    ),
]


@pytest.fixture
def stored(db_url, tmp_path):
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    with session_scope(session_factory(engine)) as s:
        devices.upsert_device(session=s, limits=H200)
        plans.store_plan_set(session=s, plans=SET)
        plans.store_plan_set(session=s, plans=[replace(SET[1], batch_bucket=3, range_lo=0)])  # B=5..8: one range
    engine.dispose()
    return db_url


def _config(c: TestClient, prefix: int, batch: int = 1) -> dict:
    r = c.get("/config", params={"H": 8, "q_len": 9, "prefix": prefix, "batch": batch})
    assert r.status_code == 200, r.text
    return r.json()


def _params(doc: dict) -> KernelConfig:
    return KernelConfig.from_params({k: doc[k] for k in PARAM_NAMES})


def test_config_answers_the_range_holding_the_prefix_and_configs_every_range(stored, tmp_path):
    with TestClient(create_app(Settings(database_url=stored, device="h200", cache_dir=tmp_path))) as c:
        at = {p: _config(c, p)["graph_plan"] for p in (0, 4095, 4096, 131071, 10**6)}
        table = c.get("/configs", params={"H": 8, "q_len": 9, "all_batches": "true"}).json()
        eight = _config(c, 0, batch=8)["graph_plan"]
    assert [_params(at[p]) for p in at] == [SHORT, SHORT, LONG, LONG, LONG]  # past the range: the last range
    assert [at[p]["range_index"] for p in at] == [0, 0, 1, 1, 1]
    short, long = at[0], at[4096]
    assert (short["prefix_lo"], short["prefix_hi"], long["prefix_lo"], long["prefix_hi"]) == (0, 4096, 4096, 131072)
    for doc in (short, long):
        assert doc["breakpoints"] == [4096] and doc["range_count"] == 2
        assert (doc["set_prefix_lo"], doc["set_prefix_hi"], doc["set_expected_us"]) == (0, 131072, 28.0)
        assert doc["expected_us_by_graphs"] == [30.0, 28.0] and (doc["max_graphs"], doc["min_saving"]) == (2, 0.02)
    assert short["regret_worst"] == pytest.approx(10 / 9.5) and len(long["buckets"]) == 10
    assert [(d["batch_bucket"]["index"], d["range_index"]) for d in table["graph_plans"]] == [(0, 0), (0, 1), (3, 0)]
    assert table["graph_plans"][:2] == [short, long] and table["graph_plans"][2] == eight
    assert (eight["breakpoints"], eight["range_count"], _params(eight)) == ([], 1, LONG)


def test_a_worker_before_ranges_keeps_one_plan_a_batch_bucket_the_longest_prefixes(stored, tmp_path):
    """What the previous release's client did with GET /configs' graph_plans: a dict by batch bucket
    of each plan's config, range and regrets (its config_table._plan_choice, as released)."""
    with TestClient(create_app(Settings(database_url=stored, device="h200", cache_dir=tmp_path))) as c:
        table = c.get("/configs", params={"H": 8, "q_len": 9, "all_batches": "true"}).json()
    old = {
        int(p["batch_bucket"]["index"]): (
            _params(p),
            (p["prefix_lo"], p["prefix_hi"]),
            tuple((b["prefix_lo"], b["prefix_hi"], b["regret"]) for b in p["buckets"]),
        )
        for p in table["graph_plans"]
    }
    assert old[0][:2] == (LONG, (4096, 131072)) and len(old[0][2]) == 10 and old[3][0] == LONG


def test_configs_show_and_dump_serve_the_set(stored, tmp_path):
    def run(*args: str):  # type: ignore[no-untyped-def]
        r = CliRunner().invoke(cli, ["--database-url", stored, *args])
        assert r.exit_code == 0, r.output
        return r.stdout

    show = ["configs", "show", "--device", "h200", "--H", "8", "--q-len", "9", "--batch", "1", "--prefix"]
    assert _params(json.loads(run(*show, "1000"))["graph_plan"]) == SHORT
    assert json.loads(run(*show, "50000"))["graph_plan"]["range_index"] == 1
    run("configs", "dump", "--out-dir", str(tmp_path / "dump"), "--shape", "8:9")
    doc = json.loads(next((tmp_path / "dump").glob("*.json")).read_text())
    assert sorted(doc["graph_plan_ranges"]) == ["1", "8"] and len(doc["graph_plan_ranges"]["1"]) == 2
    assert [_params(r) for r in doc["graph_plan_ranges"]["1"]] == [SHORT, LONG]
    # a reader of the file before ranges: one plan a batch bucket, the longest prefixes' range
    assert doc["graph_plans"]["1"] == doc["graph_plan_ranges"]["1"][-1]
    assert {SHORT, LONG} <= set(engine_files.distinct_configs(doc))  # what `dump --cubins` compiles
