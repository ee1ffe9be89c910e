"""Import files that are not what they claim (cut short, missing constants), through the CLI as
an operator runs it, on real SQLite and PostgreSQL: refused whole, nothing stored."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from verify_tuner.cli.commands import cli

#: A tuned H200 row whose structure differs from KernelConfig's defaults (STAGES=2 ... PIPE=1).
TUNED = {
    "device": "NVIDIA H200",
    "H": 8,
    "q_len": 9,
    "prefix": 46000,
    "NSPLIT": 66,
    "HT": 8,
    "TK": 32,
    "BLOCK": 256,
    "STAGES": 3,
    "QT": 0,
    "WR": 2,
    "WK": 2,
    "SF": 1,
    "PIPE": 3,
    "median_us": 40.0,
}


@pytest.fixture
def run(db_url):
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli, ["--database-url", db_url, *args], catch_exceptions=False)

    assert invoke("db", "upgrade").exit_code == 0
    return invoke


def _exported_csv(run, tmp_path) -> str:
    """The CSV `configs export` writes for TUNED (stored): a refused import must leave that row as it is."""
    src = tmp_path / "one.json"
    src.write_text(json.dumps([TUNED]))
    assert run("configs", "import", str(src)).exit_code == 0
    out = tmp_path / "all.csv"
    assert run("configs", "export", "--format", "csv", "-o", str(out)).exit_code == 0
    assert run("configs", "import", str(out)).exit_code == 0  # whole, it imports
    return out.read_text()


def _stored(run) -> list[dict]:
    return json.loads(run("configs", "list", "--json").output)


@pytest.mark.parametrize(
    ("cut_after", "what"),
    [
        (",1,", "after SF: PIPE and the times missing"),  # SF=1 is the first ",1," after the constants
        (",4", "inside median_us (40.0 cut to 4)"),
    ],
)
def test_a_csv_cut_short_is_refused_whole(run, db_url, tmp_path, cut_after, what):
    text = _exported_csv(run, tmp_path)
    header, record = text.splitlines()[:2]
    anchor = record.index(cut_after, record.index(",256,")) + len(cut_after)
    cut = tmp_path / "cut.csv"
    cut.write_text(header + "\r\n" + record[:anchor])
    before = _stored(run)
    r = run("configs", "import", str(cut))
    assert r.exit_code == 1, (what, r.output)
    assert "nothing imported" in r.output and "cut short" in r.output, r.output
    assert _stored(run) == before and before[0]["PIPE"] == 3  # the row imported whole, untouched


def test_a_csv_cut_inside_its_last_cell_is_refused(run, tmp_path):
    """Every cell is there, but the last one may be cut: the missing line break gives it away."""
    text = _exported_csv(run, tmp_path)
    cut = tmp_path / "cut.csv"
    cut.write_text(text.rstrip("\r\n"))
    r = run("configs", "import", str(cut))
    assert r.exit_code == 1 and "no line break" in r.output and "nothing imported" in r.output, r.output


def test_a_row_missing_a_structural_constant_is_refused_naming_it(run, tmp_path):
    """It took KernelConfig's defaults (STAGES=2 ... PIPE=1), not the heuristic's, and was served as tuned."""
    for name in ("STAGES", "QT", "WR", "WK", "SF", "PIPE"):
        row = {k: v for k, v in TUNED.items() if k != name}
        path = tmp_path / f"no-{name}.json"
        path.write_text(json.dumps([row]))
        r = run("configs", "import", str(path))
        assert r.exit_code == 1, (name, r.output)
        assert f"row 1: {name}: required: a row gives all ten kernel constants" in r.output, r.output
    assert run("configs", "list").output.strip() == "no tuned configs"


def test_a_row_missing_every_constant_gets_the_hint_once(run, tmp_path):
    """A row with none of the ten constants repeated the same long hint ten times on one line."""
    path = tmp_path / "bare.json"
    path.write_text(json.dumps([{"device": "h200", "H": 8, "q_len": 9, "prefix": 46000}]))
    r = run("configs", "import", str(path))
    assert r.exit_code == 1 and r.output.count("a row gives all ten kernel constants") == 1, r.output
    assert "row 1: NSPLIT HT TK BLOCK STAGES QT WR WK SF PIPE: required" in r.output, r.output


def test_a_csv_without_a_header_line_is_told_so(run, tmp_path):
    """'garbage,,' was refused as a header that "repeats column(s) ''"."""
    path = tmp_path / "garbage.csv"
    path.write_text("garbage,,\n1,2,3\n")
    r = run("configs", "import", str(path))
    assert r.exit_code == 1 and "CSV header has no name in column(s) 2, 3" in r.output, r.output


def test_importing_a_dump_of_heuristic_answers_says_why_nothing_came_in(run, tmp_path):
    """`configs dump --shape` of an untuned table, imported: 'imported 0 config(s)' and no word why."""
    assert run("configs", "dump", "--out-dir", str(tmp_path / "d"), "--shape", "8:9", "--device", "h200").exit_code == 0
    (path,) = (tmp_path / "d").glob("*.json")
    r = CliRunner().invoke(cli, ["--database-url", f"sqlite:///{tmp_path / 'other.db'}", "db", "upgrade"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(
        cli, ["--database-url", f"sqlite:///{tmp_path / 'other.db'}", "configs", "import", str(path)]
    )
    assert r.exit_code == 0 and "imported 0 config(s)" in r.output, r.output
    assert "no tuned rows (its heuristic answers are not stored)" in r.output, r.output
