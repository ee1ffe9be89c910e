"""Issue 30 items 15 and 16: what an operator gets wrong, run as `tuner` processes exactly as
reported, ends in a short error (no traceback) and a non-zero exit; issue 30 item 12: files
meant for other users are 0644."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.helpers import file_modes_bind, free_port, run_tuner, running_server, tuner_cmd

ROW = {
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
CSV_HEAD = "device,H,q_len,prefix,NSPLIT,HT,TK,BLOCK,STAGES,QT,WR,WK,SF,PIPE\n"
DOWN = "postgresql+psycopg://nobody@127.0.0.1:1/x"  # nothing listens on port 1


def _bound() -> tuple[str, ...]:
    wrap = file_modes_bind()
    if wrap is None:
        pytest.skip("running as root without setpriv: file modes do not bind")
    return wrap


@pytest.fixture
def place(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A tuned SQLite database, a read-only folder, a read-only copy of the database, a file that
    is not a database and the bad import files of the issue; yields the env and the tmp path."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    (tmp_path / "row.json").write_text(json.dumps([ROW]))
    for args in (("db", "upgrade"), ("configs", "import", str(tmp_path / "row.json"))):
        assert run_tuner({"TUNER_DATABASE_URL": url}, *args).returncode == 0
    (tmp_path / "ro").mkdir()
    (tmp_path / "rodb").mkdir()
    con = sqlite3.connect(tmp_path / "c.db")
    con.execute(f"VACUUM INTO '{tmp_path / 'rodb' / 'c.db'}'")  # a whole copy in rollback-journal mode
    con.close()
    (tmp_path / "notdb.db").write_text("not an SQLite file, only text that is long enough to have a header\n" * 4)
    (tmp_path / "m8.csv").write_text(CSV_HEAD + "h200,--8,9,46000,64,8,32,256,2,0,2,4,0,1\n")
    (tmp_path / "long.json").write_text(json.dumps([ROW]).replace('"H": 8', '"H": ' + "9" * 5000))
    (tmp_path / "long.csv").write_text(CSV_HEAD + "h200," + "9" * 5000 + ",9,46000,64,8,32,256,2,0,2,4,0,1\n")
    (tmp_path / "latin1.json").write_bytes(json.dumps([ROW]).replace("h200", "h\xe9200").encode("latin-1"))
    (tmp_path / "latin1.csv").write_bytes((CSV_HEAD + "h\xe9200,8,9,46000,64,8,32,256,2,0,2,4,0,1\n").encode("latin-1"))
    (tmp_path / "ro").chmod(0o555)
    (tmp_path / "rodb" / "c.db").chmod(0o444)
    (tmp_path / "rodb").chmod(0o555)
    yield {"TUNER_DATABASE_URL": url}, tmp_path
    (tmp_path / "ro").chmod(0o755)
    (tmp_path / "rodb").chmod(0o755)


RODB = "sqlite:///{tmp}/rodb/c.db"
NOTDB = "sqlite:///{tmp}/notdb.db"

# (id, database URL or None for the tuned one, args with {tmp} for the test's folder, a module made
# unimportable, what stderr must say)
CASES = [
    ("pg-without-psycopg", DOWN, ["db", "current"], "psycopg", "pip install 'verify-tuner[postgres]'"),
    ("mysql-url", "mysql://u@h/x", ["db", "current"], None, "TUNER_DATABASE_URL: 'mysql' is not supported"),
    ("foo-url", "foo://x/y", ["configs", "list"], None, "TUNER_DATABASE_URL: 'foo' is not supported"),
    ("in-memory-url", "sqlite://", ["db", "upgrade"], None, "an in-memory SQLite database ends with each command"),
    ("memory-path-url", "sqlite:///:memory:", ["db", "current"], None, "an in-memory SQLite database ends"),
    ("uri-filename-url", "sqlite:///file:{tmp}/c.db?uri=true", ["db", "current"], None, "URI filenames (file:...?uri=true) are not supported"),
    ("bogus-revision", None, ["db", "upgrade", "--revision", "bogus"], None, "'bogus' is not a revision: head or one of 0001"),
    ("empty-revision", None, ["db", "upgrade", "--revision", ""], None, "'' is not a revision"),
    ("relative-revision", None, ["db", "upgrade", "--revision", "head+1"], None, "'head+1' is not a revision"),
    ("export-to-empty-path", None, ["configs", "export", "-o", ""], None, "'.' is a folder; give a file name"),
    ("show-H-8_0", None, ["configs", "show", "--H", "8_0", "--q-len", "9", "--prefix", "5"], None, "'8_0' is not an integer"),
    ("show-H-arabic", None, ["configs", "show", "--H", "\u0668", "--q-len", "9", "--prefix", "5"], None, "is not an integer"),
    ("dump-shape-8_0", None, ["configs", "dump", "--out-dir", "{tmp}/d8", "--shape", "8_0:9"], None, "expected H:Q like 8:9"),
    ("serve-port-8_177", None, ["serve", "--port", "8_177"], None, "'8_177' is not an integer"),
    ("start-batch-8_0", None, ["study", "start", "--H", "8", "--q-len", "9", "--prefix", "5", "--batch", "8_0"], None, "--batch takes"),
    ("start-devices-twice", None, ["study", "start", "--H", "8", "--q-len", "9", "--prefix", "5", "--devices", "0,0"], None, "names a GPU twice"),
    ("start-only-twice", None, ["study", "start", "--H", "8", "--q-len", "9", "--prefix", "5", "--only", "BLOCK=256", "--only", "BLOCK=512"], None, "BLOCK is given twice"),
    ("current-not-a-db", NOTDB, ["db", "current"], None, "cannot be read: file is not a database"),
    ("upgrade-read-only-db", RODB, ["db", "upgrade"], None, "c.db: Permission denied"),
    ("snapshot-read-only-dir", None, ["db", "snapshot", "{tmp}/ro/s.db"], None, "/ro is not writable"),
    ("export-read-only-dir", None, ["configs", "export", "-o", "{tmp}/ro/x.json"], None, "x.json: Permission denied"),
    ("export-missing-dir", None, ["configs", "export", "-o", "{tmp}/no/x.json"], None, "No such file or directory"),
    ("dump-read-only-dir", None, ["configs", "dump", "--out-dir", "{tmp}/ro"], None, "Permission denied"),
    ("dump-under-read-only", None, ["configs", "dump", "--out-dir", "{tmp}/ro/d"], None, "ro/d: Permission denied"),
    ("report-read-only-dir", None, ["study", "report", "--out", "{tmp}/ro"], None, "Permission denied"),
    ("report-under-read-only", None, ["study", "report", "--out", "{tmp}/ro/r"], None, "ro/r: Permission denied"),
    ("show-negative-prefix", None, ["configs", "show", "--H", "8", "--q-len", "9", "--prefix", "-5"], None, "'--prefix'"),
    ("show-huge-prefix", None, ["configs", "show", "--H", "8", "--q-len", "9", "--prefix", "99999999999"], None, "'--prefix'"),
    ("show-int64-H", None, ["configs", "show", "--H", str(2**63), "--q-len", "9", "--prefix", "5"], None, "'--H'"),
    ("list-int64-H", None, ["configs", "list", "--H", str(2**63)], None, "'--H'"),
    ("start-huge-range", None, ["study", "start", "--H", "8", "--q-len", "9", "--prefix-range", "0:99999999999"], None, "--prefix-range"),
    ("import-csv-minus-minus", None, ["configs", "import", "{tmp}/m8.csv"], None, "row 1: H"),
    ("import-json-5000-digits", None, ["configs", "import", "{tmp}/long.json"], None, "value has 5000 digits"),
    ("import-csv-5000-digits", None, ["configs", "import", "{tmp}/long.csv"], None, "row 1: H"),
    ("import-json-not-utf8", None, ["configs", "import", "{tmp}/latin1.json"], None, "not UTF-8 text: byte 0xe9"),
    ("import-csv-not-utf8", None, ["configs", "import", "{tmp}/latin1.csv"], None, "not UTF-8 text: byte 0xe9"),
    # item 16
    ("unreachable-db", DOWN, ["configs", "list"], None, "database unavailable: connection failed"),
    ("read-only-db-serve", RODB, ["serve"], None, "tuner serve --read-only-database"),
    ("read-only-db-import", RODB, ["configs", "import", "{tmp}/row.json"], None, "--read-only-database"),
    ("start-negative-timeout", None, ["study", "start", "--H", "8", "--q-len", "9", "--prefix", "5", "--timeout", "-5"], None, "'--timeout'"),
    # each of these was a traceback
    ("pg-port-not-a-number", "postgresql+psycopg://postgres@127.0.0.1:543a/db", ["configs", "list"], None, "is not a database URL: 'postgresql+psycopg://postgres@127.0.0.1:543a/db' (invalid literal"),
    ("pg-unclosed-ipv6", "postgresql+psycopg://postgres@[::1/x", ["configs", "list"], None, "is not a database URL"),
    ("sqlite-timeout-abc", "sqlite:///{tmp}/c.db?timeout=abc", ["configs", "list"], None, "a parameter of the URL is not valid: could not convert string to float: 'abc'"),
    ("sqlite-same-thread-maybe", "sqlite:///{tmp}/c.db?check_same_thread=maybe", ["configs", "list"], None, "a parameter of the URL is not valid"),
    ("storage-port-not-a-number", None, ["study", "start", "--H", "8", "--q-len", "9", "--prefix", "5", "--storage", "postgresql+psycopg://x@h:5x/db"], None, "not a database URL"),
    ("start-measure-timeout-inf", None, ["study", "start", "--H", "8", "--q-len", "9", "--prefix", "5", "--measure-timeout", "inf"], None, "'inf' is not a finite number of seconds"),
    ("start-timeout-nan", None, ["study", "start", "--H", "8", "--q-len", "9", "--prefix", "5", "--timeout", "nan"], None, "'nan' is not a finite number of seconds"),
]  # fmt: skip


@pytest.mark.parametrize("url, args, block, expect", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_operator_mistakes_end_in_one_error_and_a_non_zero_exit(place, url, args, block, expect):
    """Each of these printed a traceback (or, for the last three, no hint) before issue 30."""
    env, tmp = place
    if url is not None:
        env = {"TUNER_DATABASE_URL": url.format(tmp=tmp)}
    r = run_tuner(env, *[a.format(tmp=tmp) for a in args], block=block, wrap=_bound())
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr and "sqlalche.me" not in r.stderr and expect in r.stderr, r.stderr
    assert lines[-1].startswith("Error: ") or lines[-2].startswith("Error: 1 bad row"), r.stderr
    assert len(lines) <= 3, r.stderr  # click's usage errors: Usage, Try, Error


def test_db_current_on_a_missing_path_creates_nothing(tmp_path):
    r = run_tuner({"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'typo' / 'configs.db'}"}, "db", "current")
    assert r.returncode == 1 and r.stderr.startswith("Error: no database at ") and "tuner db upgrade" in r.stderr
    assert list(tmp_path.iterdir()) == []  # neither the file nor its folder


@pytest.mark.parametrize(
    "args",
    [
        ("db", "current"),
        ("study", "report", "--out", "{tmp}/rep"),
        ("configs", "list"),
        ("db", "snapshot", "{tmp}/s.db"),
        ("serve", "--device", "h200"),
        ("serve", "--read-only-database"),
    ],
)
def test_commands_on_a_missing_database_path_create_nothing(tmp_path, args):
    # `study report`, `configs snapshot` and `serve` opened the database with create=True: a mistyped
    # path left an empty file and its folder behind before failing on the schema
    url = f"sqlite:///{tmp_path / 'typo' / 'configs.db'}"
    r = run_tuner({"TUNER_DATABASE_URL": url}, *[a.format(tmp=tmp_path / "out") for a in args])
    assert r.returncode == 1 and "Error: no database at " in r.stderr and "tuner db upgrade" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "typo").exists()


def test_a_bad_database_url_option_is_blamed_on_the_option(sqlite_url):
    r = run_tuner({"TUNER_DATABASE_URL": sqlite_url}, "--database-url", "notaurl", "db", "current")
    assert r.returncode == 2 and "Invalid value for '--database-url': not a database URL" in r.stderr, r.stderr
    assert "TUNER_DATABASE_URL" not in r.stderr


def test_the_option_overrides_a_bad_environment_url(sqlite_url):
    assert run_tuner({}, "--database-url", sqlite_url, "db", "upgrade").returncode == 0
    r = run_tuner({"TUNER_DATABASE_URL": "notaurl"}, "--database-url", sqlite_url, "db", "current")
    assert r.returncode == 0 and "current: " in r.stdout, r.stderr


def _journal_mode(path: Path) -> str:
    con = sqlite3.connect(path)
    try:
        return con.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        con.close()


def test_reading_a_snapshot_leaves_it_in_rollback_journal_mode_for_a_read_only_mount(place):
    # every connect that could write set WAL, which the file keeps: a snapshot listed once was then
    # refused by `tuner serve --read-only-database` on a read-only mount
    env, tmp = place
    snap = tmp / "snap" / "s.db"
    assert run_tuner(env, "db", "snapshot", str(snap)).returncode == 0
    at_snap = {"TUNER_DATABASE_URL": f"sqlite:///{snap}"}
    for args in (("configs", "list"), ("configs", "export"), ("device", "list"), ("db", "current")):
        r = run_tuner(at_snap, *args)
        assert r.returncode == 0, (args, r.stderr)
        assert _journal_mode(snap) == "delete", args
    assert sorted(p.name for p in snap.parent.iterdir()) == ["s.db"]
    wrap = _bound()
    snap.chmod(0o444)
    snap.parent.chmod(0o555)
    try:
        port = free_port()
        with running_server({**at_snap, "TUNER_DATABASE_READ_ONLY": "1"}, port=port, wrap=wrap):
            r = httpx.get(
                f"http://127.0.0.1:{port}/config", params={"device": "h200", "H": 8, "q_len": 9, "prefix": 46000}
            )
            assert r.status_code == 200 and r.json()["source"] == "tuned", r.text
    finally:
        snap.parent.chmod(0o755)


def test_db_upgrade_leaves_a_current_snapshot_in_rollback_journal_mode_and_starts_a_new_file_in_wal(place):
    # `db upgrade` opened every database in WAL, so a snapshot upgraded by habit (or by compose's
    # migrate step before every serve) could no longer be served from a read-only mount
    env, tmp = place
    snap = tmp / "snap" / "s.db"
    assert run_tuner(env, "db", "snapshot", str(snap)).returncode == 0
    r = run_tuner({"TUNER_DATABASE_URL": f"sqlite:///{snap}"}, "db", "upgrade")
    assert r.returncode == 0 and _journal_mode(snap) == "delete", r.stderr
    fresh = tmp / "fresh.db"
    assert run_tuner({"TUNER_DATABASE_URL": f"sqlite:///{fresh}"}, "db", "upgrade").returncode == 0
    assert _journal_mode(fresh) == "wal"


def test_a_wal_file_alone_on_a_read_only_mount_is_named_with_the_snapshot_hint(place):
    # on a read-only mount SQLite cannot even open a WAL file ("unable to open database file"), which
    # was reported as an unavailable database with no hint
    _, tmp = place
    (tmp / "mnt").mkdir()
    copy = tmp / "mnt" / "c.db"
    shutil.copy(tmp / "rodb" / "c.db", copy)
    con = sqlite3.connect(copy)
    assert con.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    con.close()
    mount = f"mount --bind {tmp / 'mnt'} {tmp / 'mnt'} && mount -o remount,ro,bind {tmp / 'mnt'}"
    if subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True, check=False).returncode != 0:
        pytest.skip("no private read-only bind mount here (unshare -m needs CAP_SYS_ADMIN)")
    code = "import sys; sys.argv[0] = 'tuner'; from verify_tuner.cli.entry import main; main()"
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", f'{mount} && exec "$0" -c "$1" serve --read-only-database', sys.executable, code],
        env={**os.environ, "TUNER_DATABASE_URL": f"sqlite:///{copy}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "unable to open database file" in r.stderr and "in WAL mode" in r.stderr, r.stderr


def test_writing_to_a_snapshot_switches_it_to_wal(place):
    # a writer's later transactions must not block readers (or be blocked by them) for the busy timeout
    env, tmp = place
    snap = tmp / "s.db"
    assert run_tuner(env, "db", "snapshot", str(snap)).returncode == 0
    r = run_tuner({"TUNER_DATABASE_URL": f"sqlite:///{snap}"}, "configs", "import", str(tmp / "row.json"))
    assert r.returncode == 0 and _journal_mode(snap) == "wal", r.stderr


def test_serving_a_read_only_wal_file_read_only_does_not_hint_at_the_flag_given(place):
    _, tmp = place
    (tmp / "rowal").mkdir()
    copy = tmp / "rowal" / "c.db"
    shutil.copy(tmp / "rodb" / "c.db", copy)
    con = sqlite3.connect(copy)
    assert con.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    con.close()
    copy.chmod(0o444)
    (tmp / "rowal").chmod(0o555)
    try:
        r = run_tuner({"TUNER_DATABASE_URL": f"sqlite:///{copy}"}, "serve", "--read-only-database", wrap=_bound())
    finally:
        (tmp / "rowal").chmod(0o755)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "in WAL mode" in r.stderr and "tuner db snapshot" in r.stderr and "--read-only-database" not in r.stderr, (
        r.stderr
    )


def test_db_current_reads_a_read_only_snapshot(place):
    _, tmp = place
    r = run_tuner({"TUNER_DATABASE_URL": f"sqlite:///{tmp}/rodb/c.db"}, "db", "current", wrap=_bound())
    assert r.returncode == 0 and r.stdout.startswith("current: 0"), r.stderr


def test_configs_list_reads_a_read_only_snapshot(place):
    # it failed on setting WAL, a write, before read-only commands stopped setting it
    _, tmp = place
    r = run_tuner({"TUNER_DATABASE_URL": f"sqlite:///{tmp}/rodb/c.db"}, "configs", "list", wrap=_bound())
    assert r.returncode == 0 and "NSPLIT=64" in r.stdout, r.stderr


def test_nothing_stored_is_said(sqlite_url, tmp_path):
    env = {"TUNER_DATABASE_URL": sqlite_url}
    assert run_tuner(env, "db", "upgrade").returncode == 0
    listed = run_tuner(env, "device", "list")
    assert listed.returncode == 0 and listed.stdout.startswith("no devices recorded"), listed.stderr
    assert json.loads(run_tuner(env, "device", "list", "--json").stdout) == []  # scripts still get JSON
    report = run_tuner(env, "study", "report", "--out", str(tmp_path / "rep"))
    assert report.returncode == 1 and "nothing tuned: no report written" in report.stderr, report.stderr
    assert not (tmp_path / "rep").exists()


def _has_gpu() -> bool:
    from tests.conftest import _has_gpu as probe

    return probe()


@pytest.mark.skipif(_has_gpu(), reason="a GPU is here: study start would tune")
def test_study_start_without_a_gpu_says_what_to_check(sqlite_url):
    env = {"TUNER_DATABASE_URL": sqlite_url}
    assert run_tuner(env, "db", "upgrade").returncode == 0
    r = run_tuner(env, "study", "start", "--H", "8", "--q-len", "9", "--prefix", "4096", "--trials", "1", timeout=240)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "measurement worker failed to start" in r.stderr
    assert "pip install -e '.[cuda]'" in r.stderr or "nvidia-smi" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "error, expect",
    [
        ("ModuleNotFoundError: No module named 'pycuda'", "pip install -e '.[cuda]'"),
        ("ModuleNotFoundError: No module named 'torch.cuda'", "pip install -e '.[cuda]'"),
        ("LogicError: cuInit failed: no CUDA-capable device is detected", "`nvidia-smi` lists GPU 3"),
    ],
)
def test_start_hint_names_what_to_check(error, expect):
    from verify_tuner.measure.gpu_backend import start_hint

    assert expect in start_hint(error, 3)


# --- item 12: files meant to be shared ----------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_study_report_on_rows_imported_without_times(place):
    """Matplotlib refused a log axis with nothing on it: a traceback from `study report`."""
    env, tmp = place
    r = run_tuner(env, "study", "report", "--out", str(tmp / "rep"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert sorted(p.suffix for p in (tmp / "rep").iterdir()) == [".md", ".png"]


def test_study_report_without_matplotlib_writes_nothing(place):
    """The table was written, then the plot stopped the command: half a report and exit 1."""
    env, tmp = place
    r = run_tuner(env, "study", "report", "--out", str(tmp / "rep"), block="matplotlib")
    assert r.returncode == 1 and r.stderr.strip() == "Error: this command needs matplotlib: pip install matplotlib"
    assert not (tmp / "rep").exists()


def test_dump_of_shapes_without_a_device_names_the_option(tmp_path):
    """With nothing recorded and no --device, --shape has no GPU to write its heuristic tables for:
    the message told the user to give --shape (given) and exited 0 with nothing written."""
    env = {"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}"}
    assert run_tuner(env, "db", "upgrade").returncode == 0
    r = run_tuner(env, "configs", "dump", "--out-dir", str(tmp_path / "d"), "--shape", "8:9")
    assert r.returncode == 1 and "--device" in r.stderr.splitlines()[-1], r.stderr
    assert not (tmp_path / "d").exists()
    r = run_tuner(env, "configs", "dump", "--out-dir", str(tmp_path / "d"), "--shape", "8:9", "--device", "h200")
    assert r.returncode == 0 and "device_name=NVIDIA_H200" in r.stdout, r.stderr


def test_show_without_a_device_tells_a_cli_user_the_option(tmp_path):
    """The sidecar's message ("e.g. device=h200") reached the CLI too, where the option is --device."""
    env = {"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}"}
    assert run_tuner(env, "db", "upgrade").returncode == 0
    r = run_tuner(env, "configs", "show", "--H", "8", "--q-len", "9", "--prefix", "46000")
    (last,) = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and last.startswith("Error: ") and "--device h200 on the command line" in last, r.stderr


@pytest.mark.parametrize(("umask", "dirs", "files"), [(0o077, 0o700, 0o600), (0o022, 0o755, 0o644)])
def test_dumped_exported_and_reported_files_follow_the_umask(place, umask, dirs, files):
    """They were 0644 in 0755 folders even under umask 077: the operator's umask is what they asked for
    (cp, tar and every other command follow it); a dump under a private one says so."""
    env, tmp = place
    mine = tmp / "mine"
    mine.mkdir(mode=0o700)  # an existing folder is left as it is
    out = mine / "out"
    for args in (
        ("configs", "dump", "--out-dir", str(out / "dump")),
        ("configs", "export", "-o", str(out / "rows.json")),
        ("study", "report", "--out", str(out / "report")),
    ):
        r = subprocess.run(
            tuner_cmd(*args), env={**os.environ, **env}, capture_output=True, text=True, umask=umask, check=False
        )
        assert r.returncode == 0, r.stderr
        if args[1] == "dump":
            assert ("umask keeps other users from reading" in r.stderr) == (umask == 0o077), r.stderr
    files_ = sorted(p for p in out.rglob("*") if p.is_file())
    assert {p.suffix for p in files_} == {".json", ".md", ".png"}
    assert {p.name: _mode(p) for p in files_} == {p.name: files for p in files_}
    assert [_mode(p) for p in (mine, out, out / "dump")] == [0o700, dirs, dirs]
    assert not [p for p in out.rglob(".*")]  # no temporary file left behind


def test_write_shared_replaces_whole_and_syncs_file_and_folder(tmp_path, monkeypatch):
    from verify_tuner.files import write_shared

    target = tmp_path / "t.json"
    target.write_text("old")
    target.chmod(0o600)
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)) or real(fd))
    write_shared(target, "new")
    assert target.read_text() == "new" and _mode(target) == 0o644
    assert synced == [False, True]  # the data, then the rename
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    from verify_tuner.files import write_shared

    target = tmp_path / "t.json"
    target.write_text("old")

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        write_shared(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["t.json"]


def test_cubin_cache_files_are_0644(tmp_path):
    from verify_tuner.kernels import build

    target = tmp_path / "k.cubin"
    build._atomic_write(target, b"\x7fELF")
    assert target.read_bytes() == b"\x7fELF" and _mode(target) == 0o644


def test_a_home_relative_sqlite_url_as_the_docs_print_it_is_the_file_under_home(tmp_path):
    """docs/operations.md prints the default as sqlite:///~/...: every engine opens that file, not
    a literal `~` folder under the working directory."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {"HOME": str(home), "TUNER_DATABASE_URL": "sqlite:///~/vt/configs.db"}
    for args in (("db", "upgrade"), ("configs", "list")):
        r = run_tuner(env, *args, cwd=cwd)
        assert r.returncode == 0, r.stderr
    assert (home / "vt" / "configs.db").stat().st_size > 0
    assert not (cwd / "~").exists()


def test_a_build_lock_another_user_created_is_one_this_user_can_take(tmp_path):
    """A shared TUNER_CACHE_DIR: the lock file of a config another user's tuner started building
    (theirs, 0644) must not stop this user's build with a PermissionError."""
    wrap = _bound()
    lock = tmp_path / "k.lock"
    lock.write_text("")
    os.chown(lock, 10001, 10001)  # another user's file (this test runs as root, its child without DAC override)
    lock.chmod(0o644)
    code = (
        "import sys; from pathlib import Path; from verify_tuner.kernels.build import _build_lock\n"
        "with _build_lock(Path(sys.argv[1])): print('locked')"
    )
    done = subprocess.run([*wrap, sys.executable, "-c", code, str(lock)], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "locked", done.stderr


def test_a_build_lock_this_user_creates_is_0644_under_a_private_umask(tmp_path):
    from verify_tuner.kernels.build import _build_lock

    old = os.umask(0o077)
    try:
        with _build_lock(tmp_path / "k.lock"):
            pass
    finally:
        os.umask(old)
    assert _mode(tmp_path / "k.lock") == 0o644


def test_export_follows_a_symlink_writes_a_pipe_and_takes_dash_for_stdout(place):
    """`-o link.json` replaced the link with a file and left its target old; `-o fifo` replaced the
    pipe (its reader waited for ever); as root `-o /dev/null` replaced the device with a file."""
    env, tmp = place
    target, link, fifo = tmp / "target.json", tmp / "link.json", tmp / "fifo"
    target.write_text("old")
    link.symlink_to(target)
    r = run_tuner(env, "configs", "export", "-o", str(link))
    assert r.returncode == 0 and link.is_symlink() and json.loads(target.read_text())[0]["NSPLIT"] == ROW["NSPLIT"]
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)  # never holds pytest
    reader.start()
    r = run_tuner(env, "configs", "export", "-o", str(fifo))
    reader.join(10)
    assert r.returncode == 0 and stat.S_ISFIFO(os.lstat(fifo).st_mode), r.stderr
    assert got and json.loads(got[0])[0]["NSPLIT"] == ROW["NSPLIT"]
    dash = run_tuner(env, "configs", "export", "-o", "-")
    assert dash.returncode == 0 and json.loads(dash.stdout)[0]["NSPLIT"] == ROW["NSPLIT"] and not (tmp / "-").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])  # ascii (LC_ALL=C): click wraps stdout's buffer itself
@pytest.mark.parametrize("args", [("configs", "list"), ("configs", "export"), ("--help",)])
def test_output_that_cannot_be_written_is_one_line_and_exit_1(place, args, encoding):
    """`tuner configs list > /dev/full` printed OSError's traceback: it named no file, so it read as a bug."""
    env, _ = place
    env = {**env, "PYTHONIOENCODING": encoding}
    code = "import sys; sys.argv[0] = 'tuner'; from verify_tuner.cli.entry import main; main()"
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-c", code, *args],
            env={**os.environ, **env},
            check=False,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert r.returncode == 1 and r.stderr == "Error: cannot write the output: No space left on device\n", r.stderr


def test_a_reader_that_left_early_ends_the_command_quietly(place):
    """`tuner configs export | head -c 10`: the reader has what it wanted; no BrokenPipeError traceback."""
    env, _ = place
    code = "import sys; sys.argv[0] = 'tuner'; from verify_tuner.cli.entry import main; main()"
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    try:
        r = subprocess.run(
            [sys.executable, "-c", code, "configs", "export"],
            env={**os.environ, **env},
            check=False,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write)
    assert r.returncode == 141 and r.stderr == "", r.stderr


def test_another_users_wal_and_shm_are_named_as_the_reason_a_write_fails(tmp_path, monkeypatch):
    """A second user who read the database (the folder writable to it) left -wal/-shm only it can
    write: every write of the owner then failed as "read-only", pointing at --read-only-database.
    (The files' modes are simulated: this test may run as root, for whom every file is writable.)"""
    import sqlite3

    import click
    from sqlalchemy.exc import OperationalError
    from verify_tuner.cli.exits import database_message
    from verify_tuner.settings import Settings
    from verify_tuner.store import health, migrate

    db = tmp_path / "c.db"
    migrate.upgrade(f"sqlite:///{db}")
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"c.db{suffix}").write_bytes(b"")
    foreign = (str(tmp_path / "c.db-wal"), str(tmp_path / "c.db-shm"))
    real_access = os.access
    monkeypatch.setattr(health.os, "access", lambda p, mode: str(p) not in foreign and real_access(p, mode))
    exc = OperationalError("INSERT ...", {}, sqlite3.OperationalError("attempt to write a readonly database"))
    with click.Context(click.Command("x"), obj=Settings(database_url=f"sqlite:///{db}")):
        line = database_message(exc)
    assert line is not None and "this user cannot write c.db-wal (uid " in line and "c.db-shm (uid " in line, line
    assert "--read-only-database" not in line
    # the sidecar's /readyz names them too (its schema read is skipped: as root here, SQLite would
    # take the files over and remove them, which it cannot do to another user's in a sticky folder)
    monkeypatch.setattr(health, "ensure_current", lambda engine, name: None)
    probed = health.probe(f"sqlite:///{db}")
    assert not probed.writable and "c.db-wal" in probed.reason and "c.db-shm" in probed.reason, probed


def test_db_upgrade_leaves_another_applications_database_as_it_was(tmp_path):
    """Pointed at another application's SQLite file by mistake, `db upgrade` wrote the config tables
    into it, and `configs list` had called it empty."""
    app = tmp_path / "app.db"
    con = sqlite3.connect(app)
    con.execute("CREATE TABLE notes (x)")
    con.commit()
    con.close()
    env = {"TUNER_DATABASE_URL": f"sqlite:///{app}"}
    for args in (("db", "upgrade"), ("configs", "list"), ("db", "current")):
        r = run_tuner(env, *args)
        assert r.returncode == 1 and "holds another application's tables (notes): not a config database" in r.stderr
    assert [n for (n,) in sqlite3.connect(app).execute("SELECT name FROM sqlite_master")] == ["notes"]


def test_a_config_database_without_its_version_table_is_named_so(tmp_path):
    """Its version table dropped, `configs list` called it empty and `db upgrade` then failed with
    "table devices already exists"."""
    db = tmp_path / "c.db"
    env = {"TUNER_DATABASE_URL": f"sqlite:///{db}"}
    assert run_tuner(env, "db", "upgrade").returncode == 0
    con = sqlite3.connect(db)
    con.execute("DROP TABLE tuner_alembic_version")
    con.commit()
    con.close()
    for args in (("db", "upgrade"), ("configs", "list")):
        r = run_tuner(env, *args)
        assert r.returncode == 1 and "holds the config tables" in r.stderr and "no schema version" in r.stderr, r.stderr
        assert "already exists" not in r.stderr


def test_a_folder_of_ones_own_without_write_permission_is_told_to_chmod_not_chown(tmp_path, monkeypatch):
    """`db snapshot` into one's own folder of mode 0500 said `chown <my uid> <folder>`, which changes
    nothing, and blamed TUNER_DATABASE_URL for the snapshot's DEST."""
    from verify_tuner.errors import StorageError
    from verify_tuner.store import session

    folder = tmp_path / "ro"
    folder.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: str(p) != str(folder) and real(p, mode))
    monkeypatch.setattr(os, "getuid", lambda: folder.stat().st_uid)  # this user owns it
    with pytest.raises(StorageError) as info:
        session.check_writable(folder / "s.db", "the snapshot's DEST")
    assert f"`chmod u+wx {folder}`" in str(info.value) and "chown" not in str(info.value)
    assert "set the snapshot's DEST to a writable path" in str(info.value)


def test_db_upgrade_says_when_it_creates_a_new_database(tmp_path):
    """A mistyped path made a new, empty database and said only 'database at revision 0007': a
    sidecar on it then served heuristics. The first upgrade says the database is new, the next not."""
    env = {"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'typo' / 'c.db'}"}
    first = run_tuner(env, "db", "upgrade")
    assert first.returncode == 0 and first.stdout.startswith("created a new database at revision "), first.stdout
    again = run_tuner(env, "db", "upgrade")
    assert again.returncode == 0 and again.stdout.startswith("database at revision "), again.stdout
