from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner
from verify_tuner.cli.commands import cli

from tests.helpers import run_tuner


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, prefix + (name,))


@pytest.mark.parametrize("path", [p for p, _ in _commands(cli)], ids=lambda p: " ".join(p))
def test_every_command_has_help(path):
    cmd = dict(_commands(cli))[path]
    assert cmd.help and cmd.help.strip(), f"{' '.join(path)} has no help text"
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output


@pytest.fixture
def run(sqlite_url):
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli, ["--database-url", sqlite_url, *args], catch_exceptions=False)

    return invoke


def test_upgrade_import_show_list_export(run, tmp_path):
    assert run("db", "upgrade").exit_code == 0
    assert "head: 0007" in run("db", "current").output
    rows = [
        {
            "device": "h200",
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
            "median_us": 40.0,
            "default_us": 80.0,
        }
    ]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    r = run("configs", "import", str(path))
    assert r.exit_code == 0 and "imported 1" in r.output
    show = json.loads(run("configs", "show", "--H", "8", "--q-len", "9", "--prefix", "46000").output)
    assert show["source"] == "tuned" and show["NSPLIT"] == 64 and show["kv_dtype"] == "bf16"
    assert (
        "NVIDIA H200  bf16 H=8 q_len=9" in run("configs", "list").output
        and "NSPLIT=64" in run("configs", "list").output
    )
    assert json.loads(run("configs", "list", "--json").output)[0]["kv_dtype"] == "bf16"
    csv_path = tmp_path / "out.csv"
    assert run("configs", "export", "--format", "csv", "-o", str(csv_path)).exit_code == 0
    assert csv_path.read_text().splitlines()[0].startswith("device,kernel_hash,kv_dtype,H,q_len,bucket")
    assert ",bf16,8,9," in csv_path.read_text().splitlines()[1]
    run("configs", "export", "--format", "csv", "-o", str(csv_path))
    # CSV round trip into a fresh database
    fresh = tmp_path / "fresh.db"
    r = CliRunner().invoke(cli, ["--database-url", f"sqlite:///{fresh}", "db", "upgrade"])
    r = CliRunner().invoke(cli, ["--database-url", f"sqlite:///{fresh}", "configs", "import", str(csv_path)])
    assert r.exit_code == 0 and "imported 1" in r.output


def test_import_rejects_file_whole_with_one_line_errors(run, tmp_path):
    run("db", "upgrade")
    rows = [
        {
            "device": "h200",
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
        },
        {
            "device": "h200",
            "H": 8,
            "q_len": 9,
            "prefix": 5000,
            "NSPLIT": 64,
            "HT": 3,
            "TK": 32,
            "BLOCK": 256,
            "STAGES": 2,
            "QT": 0,
            "WR": 2,
            "WK": 4,
            "SF": 0,
            "PIPE": 1,
        },
        {
            "device": "rtx-pro-6000",
            "H": 8,
            "q_len": 9,
            "prefix": 5000,
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
        },
    ]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    r = run("configs", "import", str(path))
    assert r.exit_code == 1
    assert "row 2" in r.output and "does not divide" in r.output and "row 3" in r.output and "shared memory" in r.output
    assert "no tuned configs" in run("configs", "list").output
    (tmp_path / "bad.json").write_text("{not json")
    r = run("configs", "import", str(tmp_path / "bad.json"))
    assert r.exit_code == 1 and "not valid JSON" in r.output


def test_commands_on_unmigrated_db_name_the_fix(run):
    r = run("configs", "list")
    assert r.exit_code == 1 and "tuner db upgrade" in r.output and "Traceback" not in r.output


def test_show_bad_device_is_one_line(run):
    run("db", "upgrade")
    r = run("configs", "show", "--H", "8", "--q-len", "9", "--prefix", "1", "--device", "nope")
    assert r.exit_code == 1 and r.output.strip().startswith("Error: device: unknown device")


def test_snapshot_is_a_self_contained_read_only_copy_the_sidecar_serves(run, tmp_path):
    import sqlite3

    from fastapi.testclient import TestClient
    from verify_tuner.api.app import create_app
    from verify_tuner.settings import Settings

    assert run("db", "upgrade").exit_code == 0
    rows = [
        {
            "device": "h200",
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
            "median_us": 70.0,
        }
    ]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    assert run("configs", "import", str(tmp_path / "rows.json")).exit_code == 0
    snap = tmp_path / "snap" / "configs.db"
    snap.parent.mkdir()
    result = run("db", "snapshot", str(snap))
    assert result.exit_code == 0 and "1 best configs" in result.output
    assert sorted(p.name for p in snap.parent.iterdir()) == ["configs.db"]  # no -wal / -shm beside it
    con = sqlite3.connect(snap)
    assert con.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    con.close()
    settings = Settings(database_url=f"sqlite:///{snap}", device="h200", database_read_only=True)
    with TestClient(create_app(settings)) as c:
        r = c.get("/config", params={"H": 8, "q_len": 9, "prefix": 46000})
        assert r.status_code == 200 and r.json()["NSPLIT"] == 64 and r.json()["source"] == "tuned"
    again = run("db", "snapshot", str(snap))  # never overwritten
    assert again.exit_code != 0 and "exists" in again.output


@pytest.mark.parametrize(
    "env, args, block, expect",
    [
        (
            {"TUNER_DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:1/x"},
            ("db", "upgrade"),
            None,
            "database unavailable",
        ),
        (
            {"TUNER_DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:1/x"},
            ("db", "current"),
            None,
            "database unavailable",
        ),
        ({"TUNER_PORT": "abc"}, ("serve",), None, "TUNER_PORT must be an integer"),
        ({"TUNER_DATABASE_READ_ONLY": "maybe"}, ("db", "current"), None, "TUNER_DATABASE_READ_ONLY must be"),
        ({"TUNER_DATABASE_URL": "notaurl"}, ("db", "current"), None, "is not a database URL"),
        ({"TUNER_WRITE_TOKEN": "short"}, ("serve",), None, "at least 16 characters"),
        ({}, ("device", "record"), "pycuda", "this command needs pycuda"),
        ({}, ("study", "start", "--H", "0", "--q-len", "9", "--prefix", "1"), None, "'--H': 0 is not in the range"),
        ({}, ("study", "start", "--H", "8", "--q-len", "65", "--prefix", "1"), None, "'--q-len'"),
        ({}, ("study", "start", "--H", "8", "--q-len", "9", "--prefix", "-1"), None, "'--prefix'"),
        (
            {},
            ("study", "start", "--H", "8", "--q-len", "9", "--prefix", "1", "--only", "NSPLT=4"),
            None,
            "unknown constant 'NSPLT'",
        ),
        ({}, ("study", "start", "--H", "8", "--q-len", "9", "--prefix", "1", "--trials", "0"), None, "'--trials'"),
        (
            {},
            ("study", "start", "--H", "8", "--q-len", "9", "--prefix", "1", "--compile-jobs", "0"),
            None,
            "'--compile-jobs'",
        ),
        (
            {},
            ("study", "start", "--H", "8", "--q-len", "9", "--prefix", "1", "--storage", "postgresql://h/{study}"),
            None,
            "Invalid value for --storage: {study} stands for each key's study in the name of an SQLite file",
        ),
        (
            {},
            ("study", "start", "--H", "8", "--q-len", "9", "--prefix", "1", "--storage", "no-url"),
            None,
            "Invalid value for --storage: not a database URL",
        ),
        (
            {"TUNER_STUDY_STORAGE": "sqlite:////tmp/{study}/x.db"},
            ("db", "upgrade"),
            None,
            "TUNER_STUDY_STORAGE: {study} stands for",
        ),
        (
            {},
            ("study", "start", "--H", "8", "--q-len", "9", "--prefix", "1", "--kv-dtype", "fp8_e5m2"),
            None,
            "Invalid value for '--kv-dtype': unknown kv_dtype 'fp8_e5m2': accepted: bf16, fp8_e4m3, fp8_e4m3_qk, fp8_ds_mla",
        ),
        (
            {},
            ("configs", "show", "--H", "8", "--q-len", "9", "--prefix", "1", "--kv-dtype", "fp16"),
            None,
            "Invalid value for '--kv-dtype': unknown kv_dtype 'fp16': accepted: bf16, fp8_e4m3",
        ),
        (
            {},
            ("study", "graph-plan", "--H", "8", "--q-len", "9", "--prefix-range", "1:2", "--kv-dtype", "fp8_e5m2"),
            None,
            "unknown kv_dtype 'fp8_e5m2': accepted: bf16, fp8_e4m3, fp8_e4m3_qk, fp8_ds_mla",
        ),
    ],
)
def test_operator_mistakes_are_one_line_and_non_zero(sqlite_url, tmp_path, env, args, block, expect):
    """Each of these printed a traceback before (issue 11 item 16)."""
    base = {"TUNER_DATABASE_URL": sqlite_url}
    assert run_tuner(base, "db", "upgrade").returncode == 0
    r = run_tuner({**base, **env}, *[str(tmp_path / "rep") if a == "OUT" else a for a in args], block=block)
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr and expect in r.stderr, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) <= 3, r.stderr


def test_version():
    r = run_tuner({}, "--version")
    assert r.returncode == 0 and r.stdout.startswith("tuner ")


def test_study_report_without_matplotlib_is_one_line(sqlite_url, tmp_path):
    base = {"TUNER_DATABASE_URL": sqlite_url}
    assert run_tuner(base, "db", "upgrade").returncode == 0
    rows = [
        {
            "device": "h200",
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
            "median_us": 40.0,
            "default_us": 80.0,
        }
    ]
    (tmp_path / "r.json").write_text(json.dumps(rows))
    assert run_tuner(base, "configs", "import", str(tmp_path / "r.json")).returncode == 0
    r = run_tuner(base, "study", "report", "--out", str(tmp_path / "rep"), block="matplotlib")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "this command needs matplotlib" in r.stderr, r.stderr


def test_study_start_exits_non_zero_when_a_key_stores_nothing(run, monkeypatch):
    """A key whose every config failed the gate stores nothing: a script running `study start`
    must see that in the exit code, not only in the table."""
    from verify_tuner.jobs import runner
    from verify_tuner.keys import ConfigKey
    from verify_tuner.search.outcome import Outcome

    def fake_tune(settings, job, ordinal, on_progress=None, on_key_done=None):
        wl = job.workloads[0]
        key = ConfigKey("NVIDIA H200", "x", "bf16", wl.H, wl.q_len, 15)
        from verify_tuner.jobs.claims import JobResult

        return JobResult([Outcome(key, wl, 1, decision="no config passed the correctness gate: nothing stored")])

    monkeypatch.setattr(runner, "tune_on_device", fake_tune)
    assert run("db", "upgrade").exit_code == 0
    r = run("study", "start", "--H", "8", "--q-len", "9", "--prefix", "46000")
    assert r.exit_code == 1 and "1 key(s) ended with nothing stored" in r.output and "correctness gate" in r.output


@pytest.mark.parametrize("args", [(), ("--compile-jobs", "3")])
def test_study_start_puts_trials_in_flight_per_gpu(run, monkeypatch, args):
    """Without --compile-jobs a GPU gets the host's cores divided by the GPUs (at most 8)."""
    from verify_tuner.jobs import runner
    from verify_tuner.jobs.claims import JobResult

    seen = []
    monkeypatch.setattr(runner, "tune_on_device", lambda settings, job, ordinal, **kw: seen.append(job) or JobResult())
    assert run("db", "upgrade").exit_code == 0
    assert run("study", "start", "--H", "8", "--q-len", "9", "--prefix", "46000", *args).exit_code == 0
    assert seen[0].compile_jobs == (3 if args else runner.default_compile_jobs(1))
    assert runner.default_compile_jobs(10**6) == 1 and 1 <= runner.default_compile_jobs(1) <= 8


@pytest.mark.parametrize("value", ["0", "1,x", "5000", ""])
def test_study_start_rejects_a_bad_batch_in_one_line(value, tmp_path):
    from click.testing import CliRunner
    from verify_tuner.cli.commands import cli

    r = CliRunner().invoke(
        cli,
        ["study", "start", "--H", "8", "--q-len", "9", "--prefix", "4096", "--batch", value],
        env={"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}"},
    )
    assert r.exit_code == 2 and "--batch" in r.output and "Traceback" not in r.output


def test_json_flags_print_valid_json(run):
    """`configs list --json | python -m json.tool` and `device list --json` work for scripts."""
    import subprocess
    import sys

    assert run("db", "upgrade").exit_code == 0
    empty = run("configs", "list", "--json")
    assert empty.exit_code == 0 and json.loads(empty.output) == []
    assert run("device", "list", "--json").exit_code == 0
    rows = [
        {
            "device": "h200",
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
    ]
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "r.json").write_text(json.dumps(rows))
        assert run("configs", "import", str(Path(d) / "r.json")).exit_code == 0
    listed = run("configs", "list", "--json").output
    (row,) = json.loads(listed)
    assert row["NSPLIT"] == 64 and row["STAGES"] == 2 and row["kernel_hash"] and row["served"] is True
    tool = subprocess.run(
        [sys.executable, "-m", "json.tool"], input=listed, capture_output=True, text=True, check=False
    )
    assert tool.returncode == 0
    (dev,) = json.loads(run("device", "list", "--json").output)
    assert dev["name"] == "NVIDIA H200" and dev["sm_count"] == 132
    show = json.loads(run("configs", "show", "--H", "8", "--q-len", "9", "--prefix", "46000", "--json").output)
    assert show["source"] == "tuned" and show["batch_bucket"] == {"index": 0, "lo": 1, "hi": 1}  # as GET /config


def test_device_filters_take_the_alias_and_refuse_an_unknown_device(run, tmp_path):
    """`--device h200` (README's spelling) matched nothing: the rows are recorded as NVIDIA H200."""
    assert run("db", "upgrade").exit_code == 0
    rows = [
        {
            "device": "h200",
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
    ]
    (tmp_path / "r.json").write_text(json.dumps(rows))
    assert run("configs", "import", str(tmp_path / "r.json")).exit_code == 0

    assert "NSPLIT=64" in run("configs", "list", "--device", "h200").output
    (listed,) = json.loads(run("configs", "list", "--device", "h200", "--json").output)
    assert listed["device"] == "NVIDIA H200"
    (exported,) = json.loads(run("configs", "export", "--device", "h200").output)
    assert exported["NSPLIT"] == 64
    dumped = run("configs", "dump", "--out-dir", str(tmp_path / "dump"), "--device", "h200")
    assert dumped.exit_code == 0 and "device_name=NVIDIA_H200" in dumped.output
    report = run("study", "report", "--out", str(tmp_path / "rep"), "--device", "h200")
    assert "nothing tuned" not in report.output
    assert "NSPLIT=64" in (tmp_path / "rep" / "tuned_nvidia-h200.md").read_text()  # written before the plot

    for args in (
        ("configs", "list"),
        ("configs", "list", "--json"),
        ("configs", "export"),
        ("configs", "dump", "--out-dir", str(tmp_path / "none")),
        ("study", "report", "--out", str(tmp_path / "none")),
    ):
        r = run(*args, "--device", "h2000")
        assert r.exit_code == 1 and r.output.strip() == (
            "Error: device: unknown device 'h2000': not recorded by the tuner and not a known GPU"
        ), (args, r.output)
    assert not (tmp_path / "none").exists()


def test_a_stale_verdict_survives_list_snapshot_and_export_import(run, sqlite_url, tmp_path):
    """Two tuned neighbour buckets, one verified stale: the live sidecar answers the stale bucket
    with the heuristic; the listing, a snapshot's sidecar and an exported-then-imported database
    must say and do the same (a snapshot without the row served the neighbour there as "nearest")."""
    from fastapi.testclient import TestClient
    from verify_tuner.api.app import create_app
    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.kernels.limits import known_device
    from verify_tuner.settings import Settings
    from verify_tuner.store import best_configs, plans
    from verify_tuner.store.migrate import checked_sessions
    from verify_tuner.store.session import session_scope

    assert run("db", "upgrade").exit_code == 0
    base = {"device": "h200", "H": 8, "q_len": 9, "HT": 8, "TK": 32, "BLOCK": 256, "median_us": 40.0}
    base |= {"STAGES": 2, "QT": 0, "WR": 2, "WK": 4, "SF": 0, "PIPE": 1}
    rows = [{**base, "prefix": 46000, "NSPLIT": 64}, {**base, "prefix": 30000, "NSPLIT": 96}]  # buckets 15, 14
    (tmp_path / "r.json").write_text(json.dumps(rows))
    assert run("configs", "import", str(tmp_path / "r.json")).exit_code == 0
    with session_scope(checked_sessions(sqlite_url)) as s:
        (row,) = [r for r in best_configs.list_best(session=s) if r.key.bucket == 15]
        h = heuristic_config(known_device("h200"), H=8, q_len=9, prefix=40000, batch=1)
        v = plans.VerificationRow(
            key=row.key,
            config=row.config,
            heuristic=h,
            stored_us=40.0,
            measured_us=80.0,
            measured_p10_us=79.0,
            measured_p90_us=81.0,
            heuristic_us=50.0,
            heuristic_p10_us=49.0,
            heuristic_p90_us=51.0,
            noise=0.05,
            verdict="stale",
            reason="the heuristic is faster",
            measured_by="test",
        )
        assert plans.record_verification(session=s, v=v)

    def served(url: str, **kw: bool) -> dict:
        settings = Settings(database_url=url, device="h200", **kw)
        with TestClient(create_app(settings)) as c:
            r = c.get("/config", params={"H": 8, "q_len": 9, "prefix": 46000})
            assert r.status_code == 200
            return r.json()

    live = served(sqlite_url)
    assert live["source"] == "heuristic" and live["stale_verified_at"]

    by_nsplit = {r["NSPLIT"]: r for r in json.loads(run("configs", "list", "--json").output)}
    assert by_nsplit[64]["served"] is False and by_nsplit[64]["verdict"] == "stale"
    assert by_nsplit[96]["served"] is True and by_nsplit[96]["verdict"] is None
    (stale_line,) = [line for line in run("configs", "list").output.splitlines() if "NSPLIT=64" in line]
    assert "verified stale" in stale_line and "not served" in stale_line

    snap = tmp_path / "snap.db"
    assert run("db", "snapshot", str(snap)).exit_code == 0
    from_snapshot = served(f"sqlite:///{snap}", database_read_only=True)
    assert from_snapshot["source"] == live["source"] and from_snapshot["NSPLIT"] == live["NSPLIT"]

    for fmt in ("json", "csv"):
        out = tmp_path / f"out.{fmt}"
        assert run("configs", "export", "--format", fmt, "-o", str(out)).exit_code == 0
        fresh = f"sqlite:///{tmp_path / f'fresh-{fmt}.db'}"
        assert CliRunner().invoke(cli, ["--database-url", fresh, "db", "upgrade"]).exit_code == 0
        r = CliRunner().invoke(cli, ["--database-url", fresh, "configs", "import", str(out)])
        assert r.exit_code == 0 and "imported 2" in r.output, r.output
        listed = CliRunner().invoke(cli, ["--database-url", fresh, "configs", "list", "--json"]).output
        imported = {r["NSPLIT"]: r for r in json.loads(listed)}
        assert imported[64]["verdict"] == "stale" and imported[64]["served"] is False, fmt
        assert imported[64]["verified_at"] == by_nsplit[64]["verified_at"], fmt
        assert imported[96]["verdict"] is None, fmt
        assert served(fresh)["source"] == "heuristic", fmt
    # a row never verified is written as before (no verdict keys), so older versions still read it
    exported = {r["NSPLIT"]: r for r in json.loads(run("configs", "export").output)}
    assert "verdict" not in exported[96] and "verified_at" not in exported[96]
    assert exported[64]["verdict"] == "stale"


@pytest.mark.parametrize(
    "storage, expect",
    [
        ("mysql://u@h/db", "TUNER_STUDY_STORAGE: 'mysql' is not supported"),  # was Optuna's ImportError
        ("sqlite+nodriver:///x.db", "TUNER_STUDY_STORAGE: unknown driver 'sqlite+nodriver'"),
        (
            "postgresql+psycopg://nobody@127.0.0.1:1/studies",  # nothing listens: no server needed
            "(study storage postgresql+psycopg://nobody@127.0.0.1:1/studies, TUNER_STUDY_STORAGE)",
        ),
        ("sqlite:///FILE/x.db", "file is a file, not a folder: set TUNER_STUDY_STORAGE"),
        ("sqlite:///FILE/{study}.db", "file is a file, not a folder: set TUNER_STUDY_STORAGE"),
    ],
    ids=["backend", "driver", "unreachable", "file", "file-per-key"],
)
def test_a_bad_study_storage_is_blamed_on_tuner_study_storage(sqlite_url, tmp_path, storage, expect):
    """`db upgrade` migrates the config database, then prepares TUNER_STUDY_STORAGE: a mistake in
    the latter named TUNER_DATABASE_URL, or the config database, or was a traceback."""
    (tmp_path / "file").write_text("")  # a regular file where the storage's directory would be
    env = {"TUNER_DATABASE_URL": sqlite_url, "TUNER_STUDY_STORAGE": storage.replace("FILE", str(tmp_path / "file"))}
    r = run_tuner(env, "db", "upgrade")
    assert r.returncode == 1 and "Traceback" not in r.stderr and expect in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "TUNER_DATABASE_URL" not in r.stderr
    assert sqlite_url not in r.stderr, r.stderr


def test_a_study_storage_option_on_an_unsupported_backend_is_one_line():
    r = run_tuner({}, "study", "start", "--H", "8", "--q-len", "9", "--prefix", "1", "--storage", "mysql://u@h/db")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "Invalid value for --storage: 'mysql' is not supported" in r.stderr, r.stderr


def test_upgrade_prints_the_revision_the_database_is_at(run):
    """`--revision 0001` on a database at head printed "at revision 0001" while it stayed at head."""
    assert "database at revision 0001:" in run("db", "upgrade", "--revision", "0001").output
    assert "current: 0001" in run("db", "current").output
    assert "database at revision 0007:" in run("db", "upgrade").output
    r = run("db", "upgrade", "--revision", "0001")
    assert r.exit_code == 0
    assert "database at revision 0007 (already past 0001: `tuner db upgrade` never downgrades)" in r.output
    assert "current: 0007" in run("db", "current").output


def test_a_database_a_newer_version_migrated_is_named_as_such_not_as_outdated(sqlite_url, tmp_path):
    """During a rollout a newer verify-tuner migrates the shared database: this version said it was
    outdated and to run `tuner db upgrade`, which then failed on alembic's "Can't locate revision"."""
    import sqlite3

    env = {"TUNER_DATABASE_URL": sqlite_url}
    assert run_tuner(env, "db", "upgrade").returncode == 0
    con = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    con.execute("UPDATE tuner_alembic_version SET version_num = '9999'")
    con.commit()
    con.close()
    for args in (("configs", "list"), ("db", "upgrade"), ("serve", "--device", "h200", "--port", "1")):
        r = run_tuner(env, *args)
        assert r.returncode == 1 and "Traceback" not in r.stderr, (args, r.stderr)
        assert f"database {sqlite_url} is at revision 9999, which this version does not know" in r.stderr, (args, r)
        assert "a newer verify-tuner migrated it" in r.stderr and "tuner db upgrade" not in r.stderr, r.stderr
