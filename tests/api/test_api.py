from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from verify_tuner.api.app import create_app
from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.kernels.validate import check
from verify_tuner.settings import Settings
from verify_tuner.store import migrate

H200 = known_device("h200")
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
    "default_us": 90.0,
}
AUTH = {"Authorization": "Bearer s3cret-token-for-tests"}


@pytest.fixture
def client(db_url, tmp_path):
    migrate.upgrade(db_url)
    settings = Settings(database_url=db_url, device="h200", write_token="s3cret-token-for-tests", cache_dir=tmp_path)
    with TestClient(create_app(settings)) as c:
        yield c


def get(client, **params):
    return client.get("/config", params={"H": 8, "q_len": 9, "prefix": 46000, **params})


def test_heuristic_on_empty_database_is_valid_for_the_device(client):
    r = get(client)
    assert r.status_code == 200
    body = r.json()
    assert body["source"] == "heuristic" and body["device"] == "NVIDIA H200"
    assert body["bucket"] == {"index": 15, "lo": 32768, "hi": 46341}
    cfg = KernelConfig.from_params({k: body[k] for k in PARAM_NAMES})
    assert check(cfg, H200, H=8, q_len=9) is None
    assert body["expected_us"] is None and body["tuned_at"] is None


def test_import_then_tuned_then_nearest(client):
    assert client.post("/configs/import", json=[ROW], headers=AUTH).json()["imported"] == 1
    tuned = get(client).json()
    assert (tuned["source"], tuned["NSPLIT"], tuned["expected_us"]) == ("tuned", 64, 50.0)
    assert tuned["speedup_vs_default"] == pytest.approx(1.8) and tuned["tuned_at"]
    near = get(client, prefix=60000).json()  # within one octave of the tuned bucket
    assert near["source"] == "nearest" and near["NSPLIT"] == 64 and near["tuned_bucket"] == 15
    assert near["bucket"]["lo"] <= 60000 < near["bucket"]["hi"]
    other_q = get(client, q_len=1).json()
    assert other_q["source"] == "heuristic"


def test_sm120_device_gets_a_config_that_fits_it(client):
    body = get(client, device="rtx-pro-6000").json()
    cfg = KernelConfig.from_params({k: body[k] for k in PARAM_NAMES})
    assert check(cfg, known_device("rtx-pro-6000"), H=8, q_len=9) is None


@pytest.mark.parametrize(
    "params,param",
    [
        ({"H": 0}, "H"),
        ({"H": -3}, "H"),
        ({"H": "x"}, "H"),
        ({"q_len": 0}, "q_len"),
        ({"q_len": 65}, "q_len"),
        ({"prefix": -1}, "prefix"),
        ({"prefix": 10**12}, "prefix"),
        ({"prefix": 1.5}, "prefix"),
        ({"dtype": "fp8"}, "dtype"),
        ({"kv_dtype": "fp8"}, "kv_dtype"),
        ({"kv_dtype": "fp8_e5m2"}, "kv_dtype"),
        ({"device": "no-such-gpu"}, "device"),
    ],
)
def test_bad_input_is_422_naming_the_parameter(client, params, param):
    r = get(client, **params)
    assert r.status_code == 422
    locs = [d["loc"] for d in r.json()["detail"]]
    assert ["query", param] in locs, locs


def test_missing_parameter_is_422(client):
    r = client.get("/config", params={"H": 8, "q_len": 9})
    assert r.status_code == 422 and ["query", "prefix"] in [d["loc"] for d in r.json()["detail"]]


def test_q_len_64_on_the_rtx_pro_6000_is_served_with_row_tiles(client):
    """Kernel v1 had no config for q_len 49..64 in 99 KB (a 422); v2 splits the rows into tiles."""
    r = get(client, device="rtx-pro-6000", q_len=64, H=8)
    assert r.status_code == 200, r.text
    body = r.json()
    cfg = KernelConfig.from_params({k: body[k] for k in PARAM_NAMES})
    assert 0 < cfg.qt < 64 and check(cfg, known_device("rtx-pro-6000"), H=8, q_len=64) is None


def test_q_len_beyond_the_tree_mask_is_422_naming_it(client):
    r = get(client, q_len=65, H=8)
    assert r.status_code == 422 and "q_len" in r.json()["detail"][0]["loc"]


def test_table_covers_every_bucket_with_etag(client):
    client.post("/configs/import", json=[ROW], headers=AUTH)
    r = client.get("/configs", params={"H": 8, "q_len": 9})
    assert r.status_code == 200
    body = r.json()
    from verify_tuner.buckets import ALL

    assert [c["bucket"]["index"] for c in body["configs"]] == [b.index for b in ALL]
    assert {c["source"] for c in body["configs"]} == {"tuned", "nearest", "heuristic"}
    assert all(c["source"] == "heuristic" for c in body["configs"] if abs(c["bucket"]["index"] - 15) > 2)
    etag = r.headers["etag"]
    assert client.get("/configs", params={"H": 8, "q_len": 9}, headers={"If-None-Match": etag}).status_code == 304
    client.post("/configs/import", json=[{**ROW, "NSPLIT": 32}], headers=AUTH)
    r2 = client.get("/configs", params={"H": 8, "q_len": 9}, headers={"If-None-Match": etag})
    assert r2.status_code == 200 and r2.headers["etag"] != etag


def test_if_none_match_compares_as_rfc_9110_says(client):
    """A compressing proxy (nginx gzip) passes the tag on weakened: an exact string match made every
    worker's revalidation download the whole table again; lists and * are If-None-Match too."""
    q = {"H": 8, "q_len": 9}
    etag = client.get("/configs", params=q).headers["etag"]
    for header in (etag, f"W/{etag}", f'"other", {etag}', f'W/"other" , W/{etag}', "*"):
        r = client.get("/configs", params=q, headers={"If-None-Match": header})
        assert r.status_code == 304 and r.headers["etag"] == etag, header
    for header in ('"other"', f'W/{etag[:-2]}"', ""):
        assert client.get("/configs", params=q, headers={"If-None-Match": header}).status_code == 200, header


def test_writes_need_the_token(client):
    assert client.post("/configs/import", json=[ROW]).status_code == 401
    assert client.post("/configs/import", json=[ROW], headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.delete("/configs", params={"device": "NVIDIA H200"}).status_code == 401
    client.post("/configs/import", json=[ROW], headers=AUTH)
    assert client.delete("/configs", params={"device": "NVIDIA H200"}, headers=AUTH).json() == {
        "deleted": 1,
        "plans_deleted": 0,
    }
    assert get(client).json()["source"] == "heuristic"


def test_import_rejects_the_whole_batch(client):
    bad = {**ROW, "prefix": 4096, "HT": 3}
    r = client.post("/configs/import", json=[ROW, bad], headers=AUTH)
    assert r.status_code == 422
    assert "row 2" in r.json()["detail"]["errors"][0]
    assert get(client).json()["source"] == "heuristic"  # row 1 was not stored either


def test_writes_off_without_token(db_url, tmp_path):
    migrate.upgrade(db_url)
    with TestClient(create_app(Settings(database_url=db_url, device="h200", cache_dir=tmp_path))) as c:
        r = c.post("/configs/import", json=[ROW], headers=AUTH)
    assert r.status_code == 403 and "TUNER_WRITE_TOKEN" in r.json()["detail"]


def test_health_ready_metrics_docs(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {
        "status": "ready",
        "database": {"readable": True, "writable": True, "read_only_expected": False},
    }
    get(client)
    get(client, H=0)
    text = client.get("/metrics").text
    assert 'tuner_requests_total{method="GET",route="/config",status="200"} 1.0' in text
    assert 'tuner_requests_total{method="GET",route="/config",status="422"} 1.0' in text
    assert 'tuner_lookups_total{source="heuristic"} 1.0' in text
    assert "/config" in client.get("/openapi.json").json()["paths"]


def test_invented_methods_share_one_metrics_series(client):
    """Each made-up method (`X123456 /config`) added its own label series to /metrics: 2 000 of them
    grew the scrape from 10 kB to 339 kB, without bound."""
    for i in range(200):
        assert client.request(f"X{i:06d}", "/config").status_code == 405
    text = client.get("/metrics").text
    assert 'tuner_requests_total{method="other",route="/config",status="405"} 200.0' in text, text
    series = [ln for ln in text.splitlines() if ln.startswith("tuner_requests_total{")]
    assert len(series) == 1 and "X000001" not in text, series  # (this scrape is counted after it)


def test_refuses_to_start_on_outdated_schema(sqlite_url, tmp_path):
    app = create_app(Settings(database_url=sqlite_url, cache_dir=tmp_path))
    with pytest.raises(RuntimeError, match="tuner db upgrade"), TestClient(app):
        pass


def test_no_default_device_needs_the_parameter(db_url, tmp_path):
    migrate.upgrade(db_url)
    with TestClient(create_app(Settings(database_url=db_url, cache_dir=tmp_path))) as c:
        r = c.get("/config", params={"H": 8, "q_len": 9, "prefix": 100})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "device"]
        assert c.get("/config", params={"H": 8, "q_len": 9, "prefix": 100, "device": "h200"}).status_code == 200


def test_batch_picks_its_bucket_and_never_borrows_a_b1_row(client):
    """`batch` selects the batch bucket; the card's request (no batch) means B=1. A config tuned
    at B=1 is not served at B=32 (not even as "nearest"): B=32 gets the heuristic, whose NSPLIT
    parts share the 32 requests out at run time (one wave, as for one request)."""
    assert client.post("/configs/import", json=[ROW], headers=AUTH).json()["imported"] == 1
    plain = get(client).json()
    assert plain["source"] == "tuned" and plain["batch_bucket"] == {"index": 0, "lo": 1, "hi": 1}
    assert get(client, batch=1).json() == plain
    b32 = get(client, batch=32).json()
    assert b32["batch_bucket"] == {"index": 5, "lo": 17, "hi": 32}
    assert b32["source"] == "heuristic" and b32["NSPLIT"] == H200.sm_count
    assert get(client, batch=17).json() == b32
    row32 = {**ROW, "batch_bucket": 5, "NSPLIT": 4, "median_us": 400.0, "default_us": 420.0}
    assert client.post("/configs/import", json=[row32], headers=AUTH).json()["imported"] == 1
    assert (get(client, batch=20).json()["source"], get(client, batch=20).json()["NSPLIT"]) == ("tuned", 4)
    assert get(client).json()["NSPLIT"] == 64  # the B=1 row is untouched


@pytest.mark.parametrize("value", ["0", "4097", "-1", "1.5", "x", ""])
def test_bad_batch_is_a_422_naming_it(client, value):
    r = client.get("/config", params={"H": 8, "q_len": 9, "prefix": 46000, "batch": value})
    assert r.status_code == 422 and "batch" in r.text


def test_configs_for_every_batch_bucket_in_one_request(client):
    from verify_tuner import batches, buckets

    one = client.get("/configs", params={"H": 8, "q_len": 9}).json()["configs"]
    assert len(one) == len(buckets.ALL) and {c["batch_bucket"]["index"] for c in one} == {0}
    b8 = client.get("/configs", params={"H": 8, "q_len": 9, "batch": 8}).json()["configs"]
    assert {c["batch_bucket"]["hi"] for c in b8} == {8}
    every = client.get("/configs", params={"H": 8, "q_len": 9, "all_batches": "true"})
    assert every.status_code == 200 and every.headers["etag"]
    cfgs = every.json()["configs"]
    assert len(cfgs) == len(buckets.ALL) * len(batches.ALL)
    assert [c for c in cfgs if c["batch_bucket"]["index"] == 0] == one
    both = client.get("/configs", params={"H": 8, "q_len": 9, "all_batches": "true", "batch": 8})
    assert both.status_code == 422 and "batch" in both.text
    # spliced from the tables' pre-rendered answers: byte for byte the model's own serialisation
    from verify_tuner.api.schemas import ConfigTableOut

    assert ConfigTableOut.model_validate_json(every.content).model_dump_json().encode() == every.content
    # new data shows at once
    again = client.get("/configs", params={"H": 8, "q_len": 9, "all_batches": "true"})
    assert again.content == every.content and again.headers["etag"] == every.headers["etag"]
    client.post("/configs/import", json=[{**ROW, "NSPLIT": 32}], headers=AUTH)
    fresh = client.get("/configs", params={"H": 8, "q_len": 9, "all_batches": "true"})
    assert fresh.headers["etag"] != every.headers["etag"]
    tuned = [c for c in fresh.json()["configs"] if c["source"] == "tuned"]
    assert tuned and all(c["NSPLIT"] == 32 for c in tuned), tuned


def test_metrics_are_prometheus_client_exposition_and_parse(client):
    """/metrics is prometheus_client's output (standard content type, process metrics, build info,
    the served tables' age) and passes the library's own parser."""
    import time

    from prometheus_client.parser import text_string_to_metric_families
    from verify_tuner.kernels import kernel_hash

    get(client)
    time.sleep(client.app.state.tables.recheck_s * 3)  # a background check has run
    r = client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=")
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert {
        "tuner_requests",
        "tuner_request_duration_seconds",
        "tuner_lookups",
        "tuner_db_errors",
        "tuner_db_path_lookups",
        "tuner_build_info",
        "tuner_table_age_seconds",
        "process_cpu_seconds",
    } <= set(fams)
    (info,) = fams["tuner_build_info"].samples
    assert info.labels["kernel_hash"] == kernel_hash() and info.labels["kernel_version"]
    (age,) = fams["tuner_table_age_seconds"].samples
    assert 0 <= age.value < 5
    done = [
        s
        for s in fams["tuner_request_duration_seconds"].samples
        if s.name.endswith("_count") and s.labels["route"] == "/config"
    ]
    assert done and done[0].value >= 1


def test_deleting_the_bests_withdraws_the_graph_plan_built_from_them(client, db_url):
    """Workers kept capturing their graphs with a plan chosen from bests the operator had deleted."""
    from verify_tuner.kernels import kernel_hash
    from verify_tuner.keys import TableKey
    from verify_tuner.store import plans
    from verify_tuner.store.session import make_engine, session_factory, session_scope

    client.post("/configs/import", json=[ROW], headers=AUTH)
    cfg = KernelConfig.from_params(
        {"NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256, "STAGES": 2, "QT": 0, "WR": 2, "WK": 4, "SF": 0, "PIPE": 1}
    )
    per_bucket = [{"bucket": b, "us": 40.0, "best_us": 39.0, "regret": 40 / 39} for b in (13, 14, 15, 16)]
    plan = plans.PlanRow(
        table=TableKey(H200.name, kernel_hash(), "bf16", 8, 9), batch_bucket=0, bucket_lo=13,
        bucket_hi=16, range_lo=13, range_hi=16, weights_digest="d" * 64, weights={"source": "equal"}, config=cfg, expected_us=40.0,
        per_bucket=per_bucket, measured_by="a test", rounds=1,
    )  # fmt: skip
    engine = make_engine(db_url)
    with session_scope(session_factory(engine)) as s:
        plans.upsert_plan(session=s, plan=plan)
    engine.dispose()
    assert get(client).json()["graph_plan"]["NSPLIT"] == 64
    r = client.delete("/configs", params={"device": "h200", "H": 8, "q_len": 9}, headers=AUTH)
    assert r.json() == {"deleted": 1, "plans_deleted": 1}
    after = get(client).json()
    assert after["source"] == "heuristic" and after["graph_plan"] is None


@pytest.mark.parametrize("order", ["old first", "new first"])
def test_naming_kv_dtype_and_its_former_name_together_is_a_422_even_at_the_default(client, order):
    """`dtype=fp8_e4m3&kv_dtype=bf16` was answered with the fp8 config: an explicit kv_dtype=bf16 read
    as "not given". Both names together are a 422 naming `dtype`, whichever values and order."""
    for old, new in (("fp8_e4m3", "bf16"), ("bf16", "fp8_e4m3"), ("bf16", "bf16")):
        pairs = [("dtype", old), ("kv_dtype", new)]
        query = "&".join(f"{k}={v}" for k, v in (pairs if order == "old first" else pairs[::-1]))
        for path, at in (("/config", "&prefix=46000"), ("/configs", "")):
            r = client.get(f"{path}?H=8&q_len=9{at}&{query}")
            assert r.status_code == 422, (path, query, r.text)
            assert r.json()["detail"][0]["loc"] == ["query", "dtype"] and "give kv_dtype only" in r.text


def test_delete_takes_one_format_s_rows_and_leaves_the_others(client):
    """An operator removing one bad fp8 row must not lose the format's neighbours: kv_dtype selects
    one format (checked as GET checks it); left out, every format's rows of the shape go."""
    rows = [ROW | {"kv_dtype": k, "NSPLIT": n} for k, n in (("bf16", 64), ("fp8_e4m3", 32), ("fp8_e4m3_qk", 16))]
    assert client.post("/configs/import", json=rows, headers=AUTH).json()["imported"] == 3
    r = client.delete("/configs", params={"device": "h200", "H": 8, "q_len": 9, "kv_dtype": "fp8_e4m3"}, headers=AUTH)
    assert r.json() == {"deleted": 1, "plans_deleted": 0}, r.text
    assert get(client, kv_dtype="fp8_e4m3").json()["source"] == "heuristic"
    assert (get(client).json()["NSPLIT"], get(client, kv_dtype="fp8_e4m3_qk").json()["NSPLIT"]) == (64, 16)
    r = client.delete("/configs", params={"device": "h200", "kv_dtype": "fp8"}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "kv_dtype"], r.text
    assert client.delete("/configs", params={"device": "h200"}, headers=AUTH).json()["deleted"] == 2


def test_a_withheld_format_is_a_422_with_its_reason(client, monkeypatch):
    """A sidecar whose process does not name fp8_ds_mla in $VERIFY_TUNER_RUN_WITHHELD (every
    deployed one) answers a worker asking for it with why it is withheld, not with a config."""
    from verify_tuner.kernels import formats

    monkeypatch.delenv(formats.RUN_WITHHELD_ENV, raising=False)
    for path, at in (("/config", {"prefix": 46000}), ("/configs", {})):
        r = client.get(path, params={"H": 8, "q_len": 9, **at, "kv_dtype": "fp8_ds_mla"})
        assert r.status_code == 422, r.text
        (detail,) = r.json()["detail"]
        assert detail["loc"] == ["query", "kv_dtype"] and "fp8_ds_mla is withheld: its GPU tests fail" in detail["msg"]
    assert get(client, kv_dtype="fp8_e4m3").json()["source"] == "heuristic"


def test_kv_dtype_is_a_key_field_of_every_lookup_and_import(client, monkeypatch):
    """kv_dtype (the KV cache's format) keys the rows and the tables: bf16 by default and as named;
    a format the kernel does not read yet (one listed ahead of its kernel code, as fp8_ds_mla was),
    or an unknown one, is a 422 naming the parameter and the accepted formats; a worker from before
    the rename (`dtype=`) gets the same answer."""
    import dataclasses

    from verify_tuner.kernels import formats

    listed = dataclasses.replace(formats.FORMATS["fp8_e4m3"], name="fp8_e5m2", about="e5m2 rows", kernel_reads=False)
    monkeypatch.setitem(formats.FORMATS, "fp8_e5m2", listed)
    assert client.post("/configs/import", json=[ROW | {"kv_dtype": "bf16"}], headers=AUTH).json()["imported"] == 1
    tuned = get(client).json()
    assert tuned["source"] == "tuned" and get(client, kv_dtype="bf16").json() == tuned
    assert get(client, dtype="bf16").json() == tuned  # an older worker's request
    table = client.get("/configs", params={"H": 8, "q_len": 9, "kv_dtype": "bf16"}).json()
    assert (table["kv_dtype"], table["dtype"]) == ("bf16", "bf16")  # `dtype`: what older workers check
    e4m3 = get(client, kv_dtype="fp8_e4m3").json()  # another key: the bf16 row does not answer it
    assert e4m3["source"] == "heuristic" and e4m3["kv_dtype"] == "fp8_e4m3"
    ds = get(client, kv_dtype="fp8_ds_mla").json()  # FlashMLA's rows: a key of their own
    assert ds["source"] == "heuristic" and ds["kv_dtype"] == "fp8_ds_mla"
    accepted = "(accepted: bf16, fp8_e4m3, fp8_e4m3_qk, fp8_ds_mla)"
    for params, param, words in (
        ({"kv_dtype": "fp8_e5m2"}, "kv_dtype", "kv_dtype fp8_e5m2 (e5m2 rows)"),
        ({"kv_dtype": "fp8_e5m2"}, "kv_dtype", f"is not read by this kernel version yet {accepted}"),
        (
            {"kv_dtype": "fp16"},
            "kv_dtype",
            "unknown kv_dtype 'fp16': accepted: bf16, fp8_e4m3, fp8_e4m3_qk, fp8_ds_mla",
        ),
        ({"dtype": "fp8_e5m2"}, "dtype", f"is not read by this kernel version yet {accepted}"),
    ):
        for path, at in (("/config", {"prefix": 46000}), ("/configs", {})):
            r = client.get(path, params={"H": 8, "q_len": 9, **at, **params})
            assert r.status_code == 422, r.text
            (detail,) = r.json()["detail"]
            assert detail["loc"] == ["query", param] and words in detail["msg"], detail
    r = client.post("/configs/import", json=[ROW | {"kv_dtype": "fp8_e5m2", "NSPLIT": 32}], headers=AUTH)
    assert r.status_code == 422 and "kv_dtype: kv_dtype fp8_e5m2" in r.json()["detail"]["errors"][0], r.text
    for path, at in (("/config", {"prefix": 46000}), ("/configs", {})):
        r = client.get(path, params={"H": 8, "q_len": 9, **at, "kv_dtype": ""})  # empty: the accepted ones, not a regex
        assert r.status_code == 422 and "unknown kv_dtype '': accepted: bf16, fp8_e4m3" in r.text, r.text
    assert get(client).json()["NSPLIT"] == 64  # nothing stored
    r = client.post("/configs/import", json=[ROW | {"kv_dtype": "fp8_e4m3", "dtype": "bf16"}], headers=AUTH)
    assert r.status_code == 422 and "give kv_dtype only (dtype is its former name)" in r.text, r.text
    r = client.post("/configs/import", json=[ROW | {"kv_dtype": "fp8_e4m3", "NSPLIT": 32}], headers=AUTH)
    assert r.json()["imported"] == 1, r.text
    e4m3 = get(client, kv_dtype="fp8_e4m3").json()
    assert (e4m3["source"], e4m3["NSPLIT"], e4m3["kv_dtype"]) == ("tuned", 32, "fp8_e4m3")
    assert get(client).json()["NSPLIT"] == 64  # the bf16 row as it was
