"""`tuner study graph-plan` and `tuner configs verify` end to end on CPU: the fake backend stands
in for the GPU (open_backend replaced, as the CLI tests replace the tuner's GPU entry point), the
plans and verdicts land in the database, the sidecar and the light client serve them."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from verify_tuner import buckets
from verify_tuner.api.app import create_app
from verify_tuner.cli import plans as cli_plans
from verify_tuner.cli.commands import cli
from verify_tuner.engine.client import ConfigClient
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels import kernel_hash
from verify_tuner.keys import ConfigKey, TableKey
from verify_tuner.settings import Settings
from verify_tuner.store import best_configs, devices, migrate, plans
from verify_tuner.store.session import make_engine, session_factory, session_scope

from tests.fakes import H200, FakeBackend
from tests.helpers import eventually

DEFAULT = heuristic_config(H200, H=8, q_len=9, prefix=46000)
SHORT = replace(DEFAULT, nsplit=64)  # the fake's landscape below: best at short prefixes
LONG = replace(DEFAULT, nsplit=264)  # best at long ones
RANGE = buckets.buckets_between(1024, 131072)


def landscape(cfg, wl):  # type: ignore[no-untyped-def]
    """SHORT wins below 16k, LONG above; the default is never best but close everywhere."""
    base = 10 + wl.prefix / 2000 * (1 + wl.batch / 32)
    if cfg == SHORT:
        return base * (0.9 if wl.prefix < 16384 else 2.0)
    if cfg == LONG:
        return base * (2.0 if wl.prefix < 16384 else 0.95)
    if cfg == DEFAULT:
        return base
    return base * 2


@pytest.fixture
def db(tmp_path):  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'configs.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    sessions = session_factory(engine)
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=H200)
        for bb in (0, 3, 5):  # B=1, 5-8, 17-32: each prefix bucket's winner as the study stored it
            for b in RANGE:
                key = ConfigKey(H200.name, kernel_hash(), "bf16", 8, 9, b.index, bb)
                best_configs.upsert_best(
                    session=s, row=best_configs.BestRow(key, SHORT if b.mid < 16384 else LONG, median_us=10.0)
                )
    yield url, sessions
    engine.dispose()


@pytest.fixture
def run(db, monkeypatch):  # type: ignore[no-untyped-def]
    url, _ = db
    backend = FakeBackend(noise=0.002, cost=landscape)
    monkeypatch.setattr(cli_plans, "open_backend", lambda settings, ordinal, timeout: backend)

    def invoke(*args: str):  # type: ignore[no-untyped-def]
        return CliRunner().invoke(cli, ["--database-url", url, *args])

    invoke.backend = backend  # type: ignore[attr-defined]
    return invoke


RANGES_ARGS = ("study", "graph-plan", "--H", "8", "--q-len", "9", "--prefix-range", "131072")
#: one graph per batch size over 1k..131k: the plan as it was before prefix ranges
PLAN_ARGS = ("study", "graph-plan", "--H", "8", "--q-len", "9", "--prefix-range", "1024:131072", "--max-graphs", "1")


def test_graph_plan_measures_the_finalists_side_by_side_and_stores_a_plan_per_batch(run, db):
    r = run(*PLAN_ARGS, "--batch", "1,8,32", "--json")
    assert r.exit_code == 0, r.output
    docs = json.loads(r.stdout)
    assert [d["batch_bucket"]["hi"] for d in docs] == [1, 8, 32]
    for d in docs:
        # equal weights, one graph: the default, never best but never bad, beats either specialist
        (one,) = d["ranges"]
        assert (one["NSPLIT"], one["weights_source"], d["breakpoints"]) == (DEFAULT.nsplit, "equal", [])
        assert len(one["buckets"]) == len(RANGE) and all(b["regret"] >= 1 for b in one["buckets"])
        assert d["regret_worst"] == pytest.approx(1 / 0.9, rel=0.02) == one["regret_worst"]
        assert d["heuristic_expected_us"] == pytest.approx(d["expected_us"])
        assert (one["max_graphs"], one["range_count"], one["set_prefix_lo"]) == (1, 1, RANGE[0].lo)
    # each batch: 3 finalists x every bucket through the gate, then re-timed together
    assert all(set(c) == {SHORT, LONG, DEFAULT} for c in run.backend.remeasured)
    _, sessions = db
    with session_scope(sessions) as s:
        stored = plans.list_plans(session=s)
    assert sorted(p.batch_bucket for p in stored) == [0, 3, 5]
    assert all(p.config == DEFAULT and p.measured_by.startswith(H200.name) for p in stored)
    text = run(*PLAN_ARGS, "--batch", "8")
    assert text.exit_code == 0 and "batch 8:" in text.stdout and "regret geomean" in text.stdout


def test_two_graphs_split_where_the_short_config_stops_winning_and_cover_prefixes_from_0(run, db):
    """The default: up to two ranges, measured from prefix 0 (`--prefix-range HI`), where no winner
    was tuned below 1024 the finalists are measured all the same."""
    r = run(*RANGES_ARGS, "--batch", "1,32", "--json")
    assert r.exit_code == 0, r.output
    assert {w.prefix for w in run.backend.workloads} >= {128, 304, 861}  # buckets 0, 1 and 4, none tuned
    for d in json.loads(r.stdout):
        short, long = d["ranges"]
        assert (short["NSPLIT"], long["NSPLIT"], d["breakpoints"]) == (SHORT.nsplit, LONG.nsplit, [16384])
        assert (short["prefix_lo"], short["prefix_hi"], long["prefix_lo"]) == (0, 16384, 16384)
        assert d["regret_worst"] == pytest.approx(1.0) and d["untuned"] == [0, 1, 2, 3, 4]
        one, two = d["expected_us_by_graphs"]
        assert two == pytest.approx(d["expected_us"]) and two < one * (1 - 0.02)
        assert d["heuristic_expected_us"] == pytest.approx(one)  # one graph: the default, close everywhere
        assert (short["range_count"], short["max_graphs"], short["min_saving"]) == (2, 2, 0.02)
    _, sessions = db
    with session_scope(sessions) as s:
        served = plans.served_sets(session=s, table=TableKey(H200.name, kernel_hash(), "bf16", 8, 9))
    assert sorted(served) == [0, 5] and all(len(p.ranges) == 2 for p in served.values())
    text = run(*RANGES_ARGS, "--batch", "8")
    assert text.exit_code == 0 and "batch 8: 2 graph(s), breakpoints [16384]" in text.stdout, text.output
    assert "range [0, 16384): NSPLIT=64" in text.stdout and "(1 graph: " in text.stdout


def test_a_further_range_that_saves_less_than_its_share_is_not_taken(run, db):
    r = run(*RANGES_ARGS, "--batch", "8", "--min-saving", "0.5", "--json")
    assert r.exit_code == 0, r.output
    (d,) = json.loads(r.stdout)
    assert [x["NSPLIT"] for x in d["ranges"]] == [DEFAULT.nsplit] and len(d["expected_us_by_graphs"]) == 2
    three = run(*RANGES_ARGS, "--batch", "8", "--max-graphs", "3", "--json")
    (d,) = json.loads(three.stdout)  # the landscape has two regimes: a third range saves nothing
    assert len(d["ranges"]) == 2 and d["ranges"][0]["max_graphs"] == 3
    assert "note: prefixes below 1024 are not measured" in run(*PLAN_ARGS, "--batch", "8").stderr


def test_prefix_weights_move_the_plan(run, db, tmp_path):
    weights = tmp_path / "hist.csv"
    weights.write_text("prefix,weight\n2000,1\n100000,50\n120000,50\n")
    r = run(*PLAN_ARGS, "--batch", "8", "--prefix-weights", str(weights), "--json")
    assert r.exit_code == 0, r.output
    (doc,) = json.loads(r.stdout)
    assert doc["ranges"][0]["NSPLIT"] == LONG.nsplit and doc["ranges"][0]["weights_source"] == str(weights)
    _, sessions = db
    with session_scope(sessions) as s:
        assert len(plans.list_plans(session=s)) == 1
    assert run(*PLAN_ARGS, "--batch", "8").exit_code == 0
    with session_scope(sessions) as s:  # a plan per weights' digest; the newest is served
        assert len(plans.list_plans(session=s)) == 2
        served = plans.served_sets(session=s, table=TableKey(H200.name, kernel_hash(), "bf16", 8, 9))
    assert [p.config for p in served[3].ranges] == [DEFAULT]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--batch", "2"), "no tuned configs for H=8 q_len=9 bf16 batch 2 in prefixes 1024:131072 on any device"),
        (("--batch", "2", "--prefix-range", "5000"), "--prefix-range 0:5000 --batch ...)"),  # what study start takes
        (("--prefix-weights", "{tmp}/missing.json"), "cannot read it"),
        (("--prefix-weights", "{tmp}/bad.json"), "weight must be a finite number"),
        (("--prefix-range", "9:1"), "--prefix-range"),
        (("--prefix-range", "x"), "--prefix-range"),
        (("--max-graphs", "0"), "--max-graphs"),
        (("--max-graphs", "two"), "--max-graphs"),
        (("--min-saving", "1"), "--min-saving"),
        (("--min-saving", "nan"), "--min-saving"),
        (("--min-saving", "-0.1"), "--min-saving"),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(run, tmp_path, args, message):
    (tmp_path / "bad.json").write_text('{"4096": -1}')
    r = run(*PLAN_ARGS, *(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert r.exit_code != 0 and message in r.output and "Traceback" not in r.output, r.output
    assert len([line for line in r.output.splitlines() if line.startswith("Error")]) == 1


def test_the_sidecar_the_dump_and_the_client_carry_the_plan(run, db, tmp_path, monkeypatch):
    assert run(*PLAN_ARGS, "--batch", "8").exit_code == 0
    url, _ = db
    with TestClient(create_app(Settings(database_url=url, device="h200", cache_dir=tmp_path))) as c:
        one = c.get("/config", params={"H": 8, "q_len": 9, "prefix": 46000, "batch": 8}).json()
        assert one["graph_plan"]["NSPLIT"] == DEFAULT.nsplit and one["graph_plan"]["batch_bucket"]["hi"] == 8
        assert one["source"] == "tuned" and one["NSPLIT"] == LONG.nsplit  # the per-bucket table stays
        assert c.get("/config", params={"H": 8, "q_len": 9, "prefix": 46000}).json()["graph_plan"] is None
        table = c.get("/configs", params={"H": 8, "q_len": 9, "all_batches": "true"}).json()
    (gp,) = table["graph_plans"]
    assert gp == one["graph_plan"] and "graph_plan" not in table["configs"][0]
    # the light client, from the sidecar's table and from a dumped folder
    monkeypatch.setattr(ConfigClient, "_get_table", lambda self, etag: (table, '"x"'))
    side = ConfigClient("http://sidecar", H=8, q_len=9, device="NVIDIA H200", snapshot_dir=tmp_path / "snap")
    assert side.fetch() == "sidecar"
    out = tmp_path / "dump"
    assert run("configs", "dump", "--out-dir", str(out)).exit_code == 0
    doc = json.loads(next(out.glob("*.json")).read_text())
    assert list(doc["graph_plans"]) == ["8"]
    folder = ConfigClient(H=8, q_len=9, device="NVIDIA H200", config_dir=out, snapshot_dir=tmp_path / "s2")
    assert folder.fetch() == "config_dir"
    for client in (side, folder):
        got = client.graph_plan(8, max_prefix=100_000)
        assert (got.config, got.source, got.prefix_range) == (DEFAULT, "graph_plan", (RANGE[0].lo, RANGE[-1].hi))
        assert len(got.regrets) == len(RANGE) and all(r >= 1 for _, _, r in got.regrets)
        fallback = client.graph_plan(32, max_prefix=100_000)  # no plan for B=32: the longest prefix's config
        assert (fallback.source, fallback.config) == ("longest_prefix", LONG) and "no graph plan" in fallback.reason
        assert client.graph_plan(8, max_prefix=10**6).reason.endswith("were not measured")


def test_a_worker_gets_every_range_from_a_tuner_serve_process_and_from_a_dump(run, db, tmp_path):
    """Two graphs for B=1: the light client reads the set's ranges from a real `tuner serve` and from
    a dumped folder alike, the range for a batch by its longest prefix, and every config of both."""
    from tests.helpers import free_port, running_server

    assert run(*RANGES_ARGS, "--batch", "1").exit_code == 0
    url, _ = db
    port = free_port()
    env = {"TUNER_DATABASE_URL": url, "TUNER_DEVICE": "h200", "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    with running_server(env, port=port):
        side = ConfigClient(f"http://127.0.0.1:{port}", H=8, q_len=9, device="NVIDIA H200", snapshot_dir=tmp_path / "s")
        assert side.fetch() == "sidecar", side.reason
    out = tmp_path / "dump"
    assert run("configs", "dump", "--out-dir", str(out)).exit_code == 0
    folder = ConfigClient(H=8, q_len=9, device="NVIDIA H200", config_dir=out, snapshot_dir=tmp_path / "s2")
    assert folder.fetch() == "config_dir"
    snapshot = ConfigClient("http://127.0.0.1:1", H=8, q_len=9, device="NVIDIA H200", snapshot_dir=tmp_path / "s")
    assert snapshot.fetch() == "snapshot"  # the sidecar's table as saved: the set survives a restart without it
    for client in (side, folder, snapshot):
        short, long = client.graph_plans(1, max_prefix=131071)
        assert (short.config, short.prefix_range, long.config, long.prefix_range) == (
            SHORT, (0, 16384), LONG, (16384, RANGE[-1].hi)
        )  # fmt: skip
        assert all(r >= 1 for _, _, r in short.regrets + long.regrets) and short.regrets[0][:2] == (0, 256)
        assert [client.graph_plan(1, max_prefix=p).config for p in (0, 16383, 16384, 10**6)] == [
            SHORT,
            SHORT,
            LONG,
            LONG,
        ]
        assert "range 1 of 2" in client.graph_plan(1, max_prefix=100).reason
        assert {SHORT, LONG} <= set(client.distinct_configs())
        (fallback,) = client.graph_plans(8, max_prefix=100_000)  # no set for B=8: one graph, the longest prefix's
        assert fallback.source == "longest_prefix" and fallback.config == LONG


def test_the_dumped_bundle_holds_a_plans_config_the_table_no_longer_serves(run, db, tmp_path, monkeypatch):
    """A plan made, then its buckets re-tuned: a host without nvcc still captures the plan's config."""
    from verify_tuner.engine import bundle as bundle_mod
    from verify_tuner.engine.bundle import Bundle

    weights = tmp_path / "hist.csv"
    weights.write_text("prefix,weight\n2000,1\n100000,50\n120000,50\n")
    assert run(*PLAN_ARGS, "--batch", "8", "--prefix-weights", str(weights)).exit_code == 0  # the plan: LONG
    _, sessions = db
    newer = replace(LONG, nsplit=128)
    with session_scope(sessions) as s:
        for bb in (0, 3, 5):
            for b in RANGE:
                if b.mid >= 16384:
                    key = ConfigKey(H200.name, kernel_hash(), "bf16", 8, 9, b.index, bb)
                    best_configs.upsert_best(session=s, row=best_configs.BestRow(key, newer, median_us=9.0))

    class Compiled:
        def __init__(self, cfg):  # type: ignore[no-untyped-def]
            self.cubin = b"\x7fELF" + str(cfg).encode()

    monkeypatch.setattr(bundle_mod, "compile_cubin", lambda cfg, q_len, arch, cache, kv_dtype: Compiled(cfg))
    out = tmp_path / "dump"
    r = run("configs", "dump", "--out-dir", str(out), "--cubins")
    assert r.exit_code == 0, r.output
    client = ConfigClient(H=8, q_len=9, device="NVIDIA H200", config_dir=out, snapshot_dir=tmp_path / "s")
    assert client.fetch() == "config_dir"
    plan = client.graph_plan(8, max_prefix=131072)
    assert plan.source == "graph_plan" and plan.config == LONG
    assert LONG not in {client.lookup(p, b) for p in (2000, 100_000) for b in (1, 8, 32)}
    assert LONG in client.distinct_configs()
    assert Bundle.open(out / "cubins").cubin(LONG, 9, H200.arch) == b"\x7fELF" + str(LONG).encode()


def test_verify_marks_a_row_that_stopped_winning_and_the_sidecar_stops_serving_it(run, db, tmp_path):
    url, sessions = db
    slow_key = ConfigKey(H200.name, kernel_hash(), "bf16", 8, 9, buckets.bucket_of(46000).index, 0)
    # after a "driver change" LONG is slower than the heuristic at B=1 (and only there)
    base_cost = run.backend.cost
    run.backend.cost = lambda cfg, wl: base_cost(cfg, wl) * (1.5 if cfg == LONG and wl.batch == 1 else 1.0)
    r = run("configs", "verify", "--sample", "100", "--json")
    assert r.exit_code == 0, r.output
    verdicts = {(v["bucket"], v["batch_bucket"]): v for v in json.loads(r.stdout)}
    assert len(verdicts) == 3 * len(RANGE)
    stale = verdicts[(slow_key.bucket, 0)]
    assert stale["verdict"] == "stale" and "no longer wins" in stale["reason"]
    assert stale["measured_us"] > stale["heuristic_us"] * 1.05
    assert verdicts[(slow_key.bucket, 3)]["verdict"] == "moved"  # still wins; the stored 10 us is long gone
    assert "verify NVIDIA H200" in r.stderr  # every decision logged with its measurements
    with TestClient(create_app(Settings(database_url=url, device="h200", cache_dir=tmp_path))) as c:
        got = c.get("/config", params={"H": 8, "q_len": 9, "prefix": 46000}).json()
        assert got["source"] == "heuristic" and got["NSPLIT"] == DEFAULT.nsplit and got["stale_verified_at"]
        b8 = c.get("/config", params={"H": 8, "q_len": 9, "prefix": 46000, "batch": 8}).json()
        assert b8["source"] == "tuned" and b8["stale_verified_at"] is None  # moved rows stay served
        c.get("/healthz")
        n_stale = sum(v["verdict"] == "stale" for v in verdicts.values())
        # the background check reads the stamp
        eventually(lambda: f"tuner_stale_rows {float(n_stale)}" in c.get("/metrics").text, "stale rows not counted")
        with session_scope(sessions) as s:  # a re-tune stores the key again
            best_configs.upsert_best(session=s, row=best_configs.BestRow(slow_key, LONG, median_us=30.0))
        retuned = {"H": 8, "q_len": 9, "prefix": 46000}
        eventually(lambda: c.get("/config", params=retuned).json()["source"] == "tuned", "the re-tune not served")
    with session_scope(sessions) as s:
        history = plans.list_verifications(session=s)
    assert len(history) == 3 * len(RANGE) and math.isfinite(history[0].noise)


def test_verify_sample_walks_the_least_recently_verified_rows(run):
    first = json.loads(run("configs", "verify", "--sample", "5", "--json").stdout)
    second = json.loads(run("configs", "verify", "--sample", "5", "--json").stdout)
    seen = lambda docs: {(d["bucket"], d["batch_bucket"]) for d in docs}
    assert len(seen(first)) == 5 and not seen(first) & seen(second)


def cold(cost):  # type: ignore[no-untyped-def]
    """The landscape with an engine's layer between launches: a fixed cold-cache cost on top."""
    return lambda cfg, wl: cost(cfg, wl) + (4.0 if wl.neighbour_mb else 0.0)


def test_a_plan_measured_cold_is_measured_cold_throughout_and_says_so_where_it_is_served(run, db, tmp_path):
    url, sessions = db
    run.backend.cost = cold(run.backend.cost)
    r = run(*PLAN_ARGS, "--batch", "1", "--neighbour-mb", "128", "--json")
    assert r.exit_code == 0, r.output
    assert run.backend.workloads and {w.neighbour_mb for w in run.backend.workloads} == {128}
    (doc,) = json.loads(r.stdout)
    assert doc["ranges"][0]["neighbour_mb"] == 128
    with session_scope(sessions) as s:
        (stored,) = plans.list_plans(session=s)
    assert stored.neighbour_mb == 128
    # the fake's cold cost is in the plan's times: each bucket's time is its back-to-back time + 4 us
    at = {b["prefix"]: b["us"] for b in stored.per_bucket}
    p = min(at)
    assert at[p] == pytest.approx(landscape(DEFAULT, replace(run.backend.workloads[0], prefix=p)) + 4.0, rel=0.02)
    with TestClient(create_app(Settings(database_url=url, device="h200", cache_dir=tmp_path))) as c:
        got = c.get("/config", params={"H": 8, "q_len": 9, "prefix": 46000}).json()
        assert got["graph_plan"]["neighbour_mb"] == 128
        assert got["source"] == "tuned" and got["neighbour_mb"] == 0  # the row itself was tuned back to back


def test_verify_re_times_each_row_as_it_was_measured(run, db):
    _, sessions = db
    key = ConfigKey(H200.name, kernel_hash(), "bf16", 8, 9, buckets.bucket_of(46000).index, 0)
    with session_scope(sessions) as s:  # this key re-tuned cold; every other row stays back to back
        best_configs.upsert_best(session=s, row=best_configs.BestRow(key, LONG, median_us=40.0, neighbour_mb=128))
    run.backend.cost = cold(run.backend.cost)
    r = run("configs", "verify", "--sample", "100", "--json")
    assert r.exit_code == 0, r.output
    by_key = {(v["bucket"], v["batch_bucket"]): v for v in json.loads(r.stdout)}
    assert by_key[(key.bucket, 0)]["neighbour_mb"] == 128
    assert {v["neighbour_mb"] for k, v in by_key.items() if k != (key.bucket, 0)} == {0}
    assert sum(w.neighbour_mb == 128 for w in run.backend.workloads) >= 2  # gate + re-time, cold
    with session_scope(sessions) as s:
        history = {(v.key.bucket, v.key.batch_bucket): v for v in plans.list_verifications(session=s)}
    assert history[(key.bucket, 0)].neighbour_mb == 128
    # re-timed cold: the fake's cold cost is in the time judged against the row's cold stored one
    wl = next(w for w in run.backend.workloads if w.neighbour_mb)
    assert history[(key.bucket, 0)].measured_us == pytest.approx(landscape(LONG, wl) + 4.0, rel=0.02)


@pytest.mark.parametrize("value", ["-1", "4097", "x"])
def test_a_neighbour_size_out_of_range_is_one_line(run, value):
    r = run(*PLAN_ARGS, "--neighbour-mb", value)
    assert r.exit_code == 2 and "--neighbour-mb" in r.output and "Traceback" not in r.output


def test_export_and_an_imported_dump_say_the_graph_plans_stay_behind(run, db, tmp_path):
    """Export rows and a dump's tuned entries carry best configs only: an import that looked whole
    left the target without the plans its workers capture with."""
    assert run(*PLAN_ARGS, "--batch", "8").exit_code == 0
    r = run("configs", "export", "--output", str(tmp_path / "rows.json"))
    assert r.exit_code == 0 and "note: 1 graph plan(s) are not in the export; `tuner db snapshot`" in r.output
    assert run("configs", "dump", "--out-dir", str(tmp_path / "dump")).exit_code == 0
    r = run("configs", "import", str(next((tmp_path / "dump").glob("*.json"))))
    assert r.exit_code == 0 and "warning: the file's 1 graph plan(s) are not imported" in r.output, r.output


def test_the_graph_plans_report_reads_the_sets_study_graph_plan_prints(run, db, tmp_path):
    """bench/graph_plans_report.py on what `study graph-plan --json` prints (as run_table_tune.sh saves
    it): each batch size's graphs, breakpoints and regret over every bucket, B=1 against the targets;
    a file printed before ranges still reads, as sets of one. bench/plan_vs_heuristic.py times, for a
    draw, the range holding its longest prefix."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench"
    r = run(*RANGES_ARGS, "--batch", "1,32", "--json")
    assert r.exit_code == 0, r.output
    (tmp_path / "plans.json").write_text(r.stdout)
    (tmp_path / "walltimes.txt").write_text("study wall 120000 ms rc=0\ngraph-plan wall 9000 ms rc=0\n")
    cmd = [sys.executable, str(bench / "graph_plans_report.py"), str(tmp_path / "plans.json"),
           str(tmp_path / "walltimes.txt"), "--device", "NVIDIA H200", "--date", "2026-12-09", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    md = (tmp_path / "graph_plans_sm_90.md").read_text()
    assert "| 1..1 | 2 | [16384] |" in md and "meets the target (geomean <= 1.02, worst <= 1.1, <= 2 graphs)" in md
    assert f"| 1..1 | [0, 16384) | {SHORT} |" in md and f"| 17..32 | [16384, {RANGE[-1].hi}) | {LONG} |" in md
    sys.path.insert(0, str(bench))
    try:
        import graph_plans_report
        import plan_vs_heuristic
    finally:
        sys.path.remove(str(bench))
    with session_scope(db[1]) as s:
        b1 = plans.served_sets(session=s, table=TableKey(H200.name, kernel_hash(), "bf16", 8, 9))[0]
    assert plan_vs_heuristic.chosen(b1, [100, 16383]) == (0, SHORT)
    assert plan_vs_heuristic.chosen(b1, [100, 16384]) == (1, LONG)
    old = json.loads(r.stdout)[0]["ranges"][1] | {
        "heuristic_expected_us": 30.0,
        "regret_worst": 1.2,
    }  # as printed before
    (one,) = graph_plans_report.as_sets([old])
    assert one["range_count"] == 1 and one["ranges"] == [old] and graph_plans_report.verdict(one).startswith("MISSES")
