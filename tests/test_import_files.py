"""Issue 11 items 7-9: import files as operators make them (a spreadsheet's CSV, a hand-edited
JSON, a file from another kernel version), through the CLI on real SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner
from verify_tuner.cli.commands import cli
from verify_tuner.kernels import kernel_hash

GOOD = {
    "device": "rtx-pro-6000",
    "H": 8,
    "q_len": 9,
    "prefix": 46000,
    "NSPLIT": 94,
    "HT": 4,
    "TK": 16,
    "BLOCK": 256,
    "STAGES": 2,
    "QT": 0,
    "WR": 4,
    "WK": 2,
    "SF": 0,
    "PIPE": 1,
    "median_us": 40.0,
}


@pytest.fixture
def run(db_url):
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli, ["--database-url", db_url, *args], catch_exceptions=False)

    assert invoke("db", "upgrade").exit_code == 0
    return invoke


def _csv(rows: list[dict], header: list[str] | None = None) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=header or list(rows[0]))
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


def test_a_spreadsheet_csv_with_a_byte_order_mark_keeps_its_device(run, tmp_path):
    path = tmp_path / "saved-by-excel.csv"
    path.write_bytes(b"\xef\xbb\xbf" + _csv([GOOD]).encode())
    r = run("configs", "import", str(path))
    assert r.exit_code == 0, r.output
    listed = run("configs", "list").output
    assert "RTX PRO 6000" in listed and "NVIDIA H200" not in listed


@pytest.mark.parametrize(
    "rename, expect",
    [
        ({"device": "Device"}, "'Device' (did you mean 'device'?)"),
        ({"NSPLIT": "NSPLT"}, "'NSPLT' (did you mean 'NSPLIT'?)"),
    ],
)
def test_unknown_or_misspelt_columns_are_rejected_naming_them(run, tmp_path, rename, expect):
    row = {rename.get(k, k): v for k, v in GOOD.items()}
    path = tmp_path / "rows.csv"
    path.write_text(_csv([row]))
    r = run("configs", "import", str(path))
    assert r.exit_code == 1 and "row 1" in r.output and expect in r.output and "Traceback" not in r.output
    assert "no tuned configs" in run("configs", "list").output


def test_a_missing_device_never_falls_back_to_the_recorded_one(run, tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([GOOD]))
    assert run("configs", "import", str(path)).exit_code == 0  # one device is now recorded
    path.write_text(json.dumps([{k: v for k, v in GOOD.items() if k != "device"} | {"prefix": 5000}]))
    r = run("configs", "import", str(path))
    assert r.exit_code == 1 and "row 1" in r.output and "device" in r.output


BAD_VALUES = [
    ({"H": 2**63}, "H"),
    ({"H": 1e30}, "H"),
    ({"NSPLIT": float("inf")}, "NSPLIT"),
    ({"tuned_at": 12345}, "tuned_at"),
    ({"device": ["h200"]}, "device"),
    ({"NSPLIT": 128.7}, "NSPLIT"),
    ({"H": True}, "H"),
    ({"median_us": float("inf")}, "median_us"),
    ({"median_us": -1.0}, "median_us"),
    ({"p10_us": 50.0, "p90_us": 30.0}, "p10_us"),
    ({"bucket": 99, "prefix": None}, "bucket"),
    ({"verdict": "bogus", "verified_at": "2026-12-01T10:00:00+00:00"}, "verdict"),
    ({"verdict": "failed", "verified_at": "2026-12-01T10:00:00+00:00"}, "verdict"),  # never a row's mark
    ({"verdict": "stale"}, "verified_at"),
    ({"verdict": "stale", "verified_at": 12345}, "verified_at"),
    ({"tuned_at": "9999-12-31T23:59:59-23:59"}, "tuned_at"),  # no UTC time: was a 'database error'
    ({"tuned_at": "0001-01-01T00:00:00+01:00"}, "tuned_at"),
]


@pytest.mark.parametrize("change, field", BAD_VALUES, ids=[f for _, f in BAD_VALUES])
def test_bad_values_are_one_line_errors_naming_row_and_field(run, tmp_path, change, field):
    row = {k: v for k, v in (GOOD | change).items() if v is not None}
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([GOOD | {"prefix": 1000}, row]))  # Python writes inf as Infinity, as some tools do
    r = run("configs", "import", str(path))
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and "row 2" in r.output and field in r.output, r.output
    assert "row 1" not in r.output  # the good row is not blamed ...
    assert "no tuned configs" in run("configs", "list").output  # ... and not stored: all or nothing


def test_the_same_key_twice_in_one_file_is_rejected(run, tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([GOOD, GOOD | {"NSPLIT": 47, "prefix": 40000}]))  # same bucket
    r = run("configs", "import", str(path))
    assert r.exit_code == 1 and "row 2: the same key as row 1" in r.output


def test_rows_of_another_kernel_import_with_a_warning_and_are_listed_as_such(run, tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([GOOD | {"kernel_hash": "0123456789abcdef"}]))
    r = run("configs", "import", str(path))
    assert r.exit_code == 0 and "warning: row 1: kernel hash 0123456789abcdef" in r.output
    listed = run("configs", "list").output
    assert "kernel 0123456789abcdef  (another kernel: not served)" in listed and "STAGES=2" in listed


def test_export_is_valid_json_and_round_trips(run, tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([GOOD, GOOD | {"prefix": 4000, "NSPLIT": 47}]))
    assert run("configs", "import", str(path)).exit_code == 0
    for fmt in ("json", "csv"):
        out = tmp_path / f"export.{fmt}"
        assert run("configs", "export", "--format", fmt, "-o", str(out)).exit_code == 0
        if fmt == "json":
            json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))
        assert run("configs", "import", str(out)).exit_code == 0  # the export imports back as it is
    assert run("configs", "list").output.count("RTX PRO 6000") == 2


def test_the_api_import_reports_another_kernels_rows(client_factory):
    with client_factory() as (c, auth):
        body = c.post("/configs/import", json=[GOOD | {"kernel_hash": "0123456789abcdef"}], headers=auth).json()
        assert body["imported"] == 1 and "0123456789abcdef" in body["warnings"][0]
        body = c.post("/configs/import", json=[GOOD | {"kernel_hash": kernel_hash()}], headers=auth).json()
        assert body == {"imported": 1, "warnings": []}
        r = c.post("/configs/import", json=[GOOD | {"NSPLIT": 128.7}], headers=auth)
        assert r.status_code == 422 and "row 1: NSPLIT" in r.json()["detail"]["errors"][0]


@pytest.fixture
def client_factory(db_url, tmp_path):
    import contextlib

    from fastapi.testclient import TestClient
    from verify_tuner.api.app import create_app
    from verify_tuner.settings import Settings
    from verify_tuner.store import migrate

    token = "import-files-token-0123"

    @contextlib.contextmanager
    def make():
        migrate.upgrade(db_url)
        settings = Settings(database_url=db_url, device="h200", write_token=token, cache_dir=tmp_path)
        with TestClient(create_app(settings)) as c:
            yield c, {"Authorization": f"Bearer {token}"}

    return make


def test_a_deeply_nested_file_is_one_line_not_a_traceback(run, tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    r = run("configs", "import", str(path))
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "not valid JSON: arrays or objects nested too deeply" in r.output
    assert "no tuned configs" in run("configs", "list").output


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_how_a_row_was_timed_survives_export_and_import(run, tmp_path, fmt):
    """A time means something only with its condition: a row tuned cold (the neighbour GEMM after
    every launch) must not come back from a file as a back-to-back time, nor the reverse."""
    from verify_tuner.buckets import bucket_of

    cold, warm = bucket_of(46000).index, bucket_of(4096).index
    src = tmp_path / "in.json"
    src.write_text(json.dumps([{**GOOD, "neighbour_mb": 128}, {**GOOD, "prefix": 4096}]))
    assert run("configs", "import", str(src)).exit_code == 0
    out = tmp_path / f"out.{fmt}"
    assert run("configs", "export", "--format", fmt, "--output", str(out)).exit_code == 0
    if fmt == "json":
        rows = {r["bucket"]: r for r in json.loads(out.read_text())}
        assert rows[cold]["neighbour_mb"] == 128 and "neighbour_mb" not in rows[warm]  # older readers take it
    else:
        rows = {int(r["bucket"]): r for r in csv.DictReader(io.StringIO(out.read_text()))}
        assert (rows[cold]["neighbour_mb"], rows[warm]["neighbour_mb"]) == ("128", "0")
    swapped = tmp_path / "swapped.json"  # the same keys with the other conditions, then the export back
    swapped.write_text(json.dumps([GOOD, {**GOOD, "prefix": 4096, "neighbour_mb": 64}]))
    assert run("configs", "import", str(swapped)).exit_code == 0
    assert run("configs", "import", str(out)).exit_code == 0
    again = tmp_path / "again.json"
    assert run("configs", "export", "--output", str(again)).exit_code == 0
    back = {r["bucket"]: r.get("neighbour_mb", 0) for r in json.loads(again.read_text())}
    assert back == {cold: 128, warm: 0}


def test_how_a_row_was_timed_survives_a_dump_and_its_import(run, tmp_path):
    """A dump file's tuned entries lacked neighbour_mb: imported, a cold row came back as timed back
    to back, and `configs verify` would re-time it under the wrong condition."""
    src = tmp_path / "in.json"
    src.write_text(json.dumps([{**GOOD, "neighbour_mb": 128}, {**GOOD, "prefix": 4096}]))
    assert run("configs", "import", str(src)).exit_code == 0
    assert run("configs", "dump", "--out-dir", str(tmp_path / "dump")).exit_code == 0
    (dumped,) = (tmp_path / "dump").glob("*.json")
    swapped = tmp_path / "swapped.json"  # the same keys timed otherwise, then the dump imported over them
    swapped.write_text(json.dumps([GOOD, {**GOOD, "prefix": 4096, "neighbour_mb": 64}]))
    assert run("configs", "import", str(swapped)).exit_code == 0
    assert run("configs", "import", str(dumped)).exit_code == 0
    again = tmp_path / "again.json"
    assert run("configs", "export", "--output", str(again)).exit_code == 0
    from verify_tuner.buckets import bucket_of

    back = {r["bucket"]: r.get("neighbour_mb", 0) for r in json.loads(again.read_text())}
    assert back == {bucket_of(46000).index: 128, bucket_of(4096).index: 0}


@pytest.mark.parametrize("bad", [-1, 4097, "128", 1.5])
def test_a_neighbour_size_out_of_range_is_a_rejected_row(run, tmp_path, bad):
    src = tmp_path / "in.json"
    src.write_text(json.dumps([{**GOOD, "neighbour_mb": bad}]))
    r = run("configs", "import", str(src))
    assert r.exit_code == 1 and "row 1" in r.output and "neighbour_mb" in r.output and "Traceback" not in r.output


def test_configs_list_says_which_rows_were_timed_cold(run, tmp_path):
    src = tmp_path / "in.json"
    src.write_text(json.dumps([{**GOOD, "neighbour_mb": 128}, {**GOOD, "prefix": 4096}]))
    assert run("configs", "import", str(src)).exit_code == 0
    from verify_tuner.buckets import bucket_of

    lines = run("configs", "list").output.splitlines()
    (cold,) = [line for line in lines if "cold: 128 MB neighbour" in line]
    assert f"prefix[{bucket_of(46000).lo}," in cold and len(lines) == 2


def test_a_file_that_is_not_rows_says_so_not_one_bad_row(run, tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{")
    r = run("configs", "import", str(path))
    assert r.exit_code == 1 and "file rejected, nothing imported" in r.output and "bad row" not in r.output


def test_a_csv_field_past_the_readers_limit_is_one_line(run, tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("device,H\n" + "x" * 200_000 + ",8\n")
    r = run("configs", "import", str(path))
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "file rejected, nothing imported: not CSV the reader takes (field larger than field limit" in r.output


def test_a_device_file_is_refused_before_reading(run):
    r = run("configs", "import", "/dev/zero")
    assert r.exit_code == 2 and "/dev/zero is not a regular file" in r.output


def test_a_csv_record_longer_than_its_header_says_so(run, tmp_path):
    path = tmp_path / "long.csv"
    head = ",".join(GOOD)
    path.write_text(head + "\n" + ",".join(str(v) for v in GOOD.values()) + ",extra,cells\n")
    r = run("configs", "import", str(path))
    assert r.exit_code == 1 and "row 1: 2 more cell(s) than the header has columns" in r.output, r.output


def _damaged(doc: dict, how: str) -> dict:
    doc = json.loads(json.dumps(doc))
    batch = next(iter(doc["configs"]))
    if how == "no-device":
        del doc["device_name"]
    elif how == "configs-a-list":
        doc["configs"] = []
    elif how == "entry-a-string":
        doc["configs"][batch] = ["tuned"]
    elif how == "batch-not-a-number":
        doc["configs"]["eight"] = doc["configs"].pop(batch)
    elif how == "prefix-lo-text":
        (tuned,) = (e for es in doc["configs"].values() for e in es if e["source"] == "tuned")
        tuned["prefix_lo"] = str(tuned["prefix_lo"])
    return doc


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("no-device", "missing device_name"),
        ("configs-a-list", "configs must be an object"),
        ("entry-a-string", "must be a list of objects"),
        ("batch-not-a-number", "configs key 'eight' is not a batch size"),
        ("prefix-lo-text", "prefix_lo '32768' is not a prefix"),
    ],
)
def test_a_damaged_dump_file_is_refused_whole_with_what_is_wrong(run, tmp_path, how, says):
    """A dump file without device_name was KeyError's traceback; `"configs": []` AttributeError's."""
    src = tmp_path / "in.json"
    src.write_text(json.dumps([GOOD]))
    assert run("configs", "import", str(src)).exit_code == 0
    assert run("configs", "dump", "--out-dir", str(tmp_path / "dump")).exit_code == 0
    (dumped,) = (tmp_path / "dump").glob("*.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_damaged(json.loads(dumped.read_text()), how)))
    r = run("configs", "import", str(bad))
    assert r.exit_code == 1 and "not a whole `tuner configs dump` file" in r.output and says in r.output, r.output


@pytest.mark.parametrize(
    ("cell", "says"),
    [
        ("\u0664\u0662", "median_us: must be a number, got '\u0664\u0662'"),  # Arabic-Indic digits
        ("4_1", "median_us: must be a number, got '4_1'"),
        (" 43", "median_us: must be a number, got ' 43'"),
        ("1e308", "median_us: must be at most 1e+09"),
    ],
)
def test_csv_timing_cells_are_as_strict_as_integer_cells(run, tmp_path, cell, says):
    """float() took '٤٢', '4_1' and ' 43' as 42, 41 and 43 where an integer cell refuses '8_0'."""
    path = tmp_path / "t.csv"
    row = {**GOOD, "median_us": "CELL"}
    path.write_text(",".join(row) + "\n" + ",".join(str(v) for v in row.values()).replace("CELL", cell) + "\n")
    r = run("configs", "import", str(path))
    assert r.exit_code == 1 and says in r.output, r.output


def test_csv_timing_cells_in_plain_notation_import(run, tmp_path):
    path = tmp_path / "t.csv"
    row = {**GOOD, "median_us": "41.5", "p10_us": "4.1e1", "p90_us": "42."}
    path.write_text(",".join(row) + "\n" + ",".join(str(v) for v in row.values()) + "\n")
    assert run("configs", "import", str(path)).exit_code == 0
    (back,) = json.loads(run("configs", "export").output)
    assert (back["p10_us"], back["median_us"], back["p90_us"]) == (41.0, 41.5, 42.0)
