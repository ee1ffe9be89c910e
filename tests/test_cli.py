from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from tuner.cli import cli


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
    assert "head: 0002" in run("db", "current").output
    rows = [{"device": "h200", "H": 8, "q_len": 9, "prefix": 46000, "NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256,
             "median_us": 40.0, "default_us": 80.0}]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    r = run("configs", "import", str(path))
    assert r.exit_code == 0 and "imported 1" in r.output
    show = json.loads(run("configs", "show", "--H", "8", "--q-len", "9", "--prefix", "46000").output)
    assert show["source"] == "tuned" and show["NSPLIT"] == 64
    assert "NSPLIT=64" in run("configs", "list").output
    csv_path = tmp_path / "out.csv"
    assert run("configs", "export", "--format", "csv", "-o", str(csv_path)).exit_code == 0
    assert csv_path.read_text().splitlines()[0].startswith("device,kernel_hash,dtype,H,q_len,bucket")
    run("configs", "export", "--format", "csv", "-o", str(csv_path))
    # CSV round trip into a fresh database
    fresh = tmp_path / "fresh.db"
    r = CliRunner().invoke(cli, ["--database-url", f"sqlite:///{fresh}", "db", "upgrade"])
    r = CliRunner().invoke(cli, ["--database-url", f"sqlite:///{fresh}", "configs", "import", str(csv_path)])
    assert r.exit_code == 0 and "imported 1" in r.output


def test_import_rejects_file_whole_with_one_line_errors(run, tmp_path):
    run("db", "upgrade")
    rows = [{"device": "h200", "H": 8, "q_len": 9, "prefix": 46000, "NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256},
            {"device": "h200", "H": 8, "q_len": 9, "prefix": 5000, "NSPLIT": 64, "HT": 3, "TK": 32, "BLOCK": 256},
            {"device": "rtx-pro-6000", "H": 8, "q_len": 9, "prefix": 5000, "NSPLIT": 64, "HT": 8, "TK": 32,
             "BLOCK": 256}]
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

    from api.app import create_app
    from tuner.settings import Settings

    assert run("db", "upgrade").exit_code == 0
    rows = [{"device": "h200", "H": 8, "q_len": 9, "prefix": 46000, "NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256,
             "median_us": 70.0}]
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
