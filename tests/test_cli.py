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
    assert "head: 0001" in run("db", "current").output
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
