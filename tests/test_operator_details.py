"""The smaller things an operator met in a first hour: each as they met it (the CLI as processes or
through click's runner, the app as a worker asks it, the worker client), on real SQLite files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from verify_tuner.api.app import create_app
from verify_tuner.cli.commands import cli
from verify_tuner.engine.client import ConfigClient
from verify_tuner.settings import Settings

from tests.helpers import run_tuner

ROW = {"device": "h200", "H": 8, "q_len": 9, "prefix": 46000, "NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256}
ROW |= {"STAGES": 2, "QT": 0, "WR": 2, "WK": 4, "SF": 0, "PIPE": 1, "median_us": 40.0}
TOKEN = "operator-details-token-0123"


@pytest.fixture
def db(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    (tmp_path / "row.json").write_text(json.dumps([ROW]))
    for args in (("db", "upgrade"), ("configs", "import", str(tmp_path / "row.json"))):
        assert run_tuner({"TUNER_DATABASE_URL": url}, *args).returncode == 0
    return url


def _cli(url: str, *args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["--database-url", url, *args], catch_exceptions=False)


def test_db_current_fails_when_the_database_needs_an_upgrade(tmp_path):
    url = {"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}"}
    assert run_tuner(url, "db", "upgrade", "--revision", "0001").returncode == 0
    r = run_tuner(url, "db", "current")
    assert r.returncode == 1 and "current: 0001" in r.stdout and "tuner db upgrade" in r.stderr, (r.stdout, r.stderr)
    assert run_tuner(url, "db", "upgrade").returncode == 0
    assert run_tuner(url, "db", "current").returncode == 0


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/proc/x.db", "/proc does not take new files"),  # said only "No such file or directory"
        ("/etc/passwd/x.db", "/etc/passwd is a file, not a folder"),  # said "(File exists)"
        ("/etc/passwd/sub/x.db", "/etc/passwd is a file, not a folder"),
    ],
)
def test_a_database_path_that_cannot_be_created_says_why(path, says):
    r = run_tuner({"TUNER_DATABASE_URL": f"sqlite:///{path}"}, "db", "upgrade")
    assert r.returncode == 1 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not Path(path).exists()


def test_a_csv_file_not_named_csv_is_pointed_at_the_format_option(db, tmp_path):
    out = tmp_path / "rows.csv"
    assert _cli(db, "configs", "export", "--format", "csv", "-o", str(out)).exit_code == 0
    txt = tmp_path / "rows.txt"
    txt.write_bytes(out.read_bytes())
    r = _cli(db, "configs", "import", str(txt))
    assert r.exit_code == 1 and "not valid JSON" in r.output and "--format csv" in r.output, r.output
    assert _cli(db, "configs", "import", "--format", "csv", str(txt)).exit_code == 0


def test_graph_plan_says_nothing_is_stored_before_it_needs_pycuda(tmp_path):
    url = {"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}"}
    assert run_tuner(url, "db", "upgrade").returncode == 0
    r = run_tuner(url, "study", "graph-plan", "--H", "8", "--q-len", "9", "--prefix-range", "1024:8192", block="pycuda")
    assert r.returncode == 1 and "no tuned configs" in r.stderr and "pycuda" not in r.stderr.lower(), r.stderr


def test_configs_show_prints_what_get_config_answers(db, tmp_path):
    shown = json.loads(_cli(db, "configs", "show", "--H", "8", "--q-len", "9", "--prefix", "46000").output)
    with TestClient(create_app(Settings(database_url=db, device="h200"))) as c:
        served = c.get("/config", params={"H": 8, "q_len": 9, "prefix": 46000}).json()
    assert shown == served and shown["source"] == "tuned"


def test_the_http_import_takes_what_the_cli_takes(db, tmp_path):
    """JSON only, and a UTF-8 byte-order mark refused, where the CLI took CSV, dump files and the mark."""
    csv_file, dump = tmp_path / "rows.csv", tmp_path / "dump"
    assert _cli(db, "configs", "export", "--format", "csv", "-o", str(csv_file)).exit_code == 0
    assert _cli(db, "configs", "dump", "--out-dir", str(dump)).exit_code == 0
    (dumped,) = dump.iterdir()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(Settings(database_url=db, device="h200", write_token=TOKEN))) as c:
        for body, kind in (
            (csv_file.read_bytes(), "text/csv"),
            (b"\xef\xbb\xbf" + csv_file.read_bytes(), "text/csv; charset=utf-8"),
            (dumped.read_bytes(), "application/json"),
            (b"\xef\xbb\xbf" + json.dumps([ROW]).encode(), "application/json"),
        ):
            r = c.post("/configs/import", content=body, headers={**auth, "Content-Type": kind})
            assert r.status_code == 200 and r.json()["imported"] == 1, (kind, r.text)


def test_a_worker_url_without_a_scheme_is_refused_at_once():
    """It fell back to a snapshot, and the reason said only that the table could not be used."""
    with pytest.raises(ValueError, match="not an http:// or https:// URL"):
        ConfigClient("127.0.0.1:8177", H=8, q_len=9, device="h200")


def test_refresh_of_a_folder_source_rereads_the_folder(db, tmp_path):
    dump = tmp_path / "dump"
    assert _cli(db, "configs", "dump", "--out-dir", str(dump)).exit_code == 0
    client = ConfigClient(None, H=8, q_len=9, device="h200", config_dir=dump, snapshot_dir=tmp_path / "snap")
    assert client.fetch() == "config_dir" and client.lookup(46000).nsplit == 64
    assert client.refresh() == "unchanged"  # it said "failed" whatever the folder held
    (tmp_path / "new.json").write_text(json.dumps([{**ROW, "NSPLIT": 32}]))
    assert _cli(db, "configs", "import", str(tmp_path / "new.json")).exit_code == 0
    assert _cli(db, "configs", "dump", "--out-dir", str(dump)).exit_code == 0
    assert client.refresh() == "updated" and client.lookup(46000).nsplit == 32, client.refresh_error


def test_a_redump_names_the_files_it_did_not_write(db, tmp_path):
    dump = tmp_path / "dump"
    assert _cli(db, "configs", "dump", "--out-dir", str(dump), "--shape", "16:9").exit_code == 0
    r = _cli(db, "configs", "dump", "--out-dir", str(dump))  # H=16 no longer asked for
    assert r.exit_code == 0
    assert "1 config file(s)" in r.stderr and "H=16,q_len=9,device_name=NVIDIA_H200,dtype=bf16.json" in r.stderr


def test_dump_with_cubins_says_it_is_compiling(db, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from verify_tuner.engine import bundle as bundle_mod

    monkeypatch.setattr(
        bundle_mod, "compile_cubin", lambda cfg, q_len, arch, cache, kv_dtype: SimpleNamespace(cubin=b"\x7fELF")
    )
    r = _cli(db, "configs", "dump", "--out-dir", str(tmp_path / "dump"), "--cubins")
    assert r.exit_code == 0 and re.search(r"compiling \d+ cubin\(s\) for sm_90 with nvcc", r.stderr), r.stderr
