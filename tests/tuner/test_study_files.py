"""Where Optuna's studies live (verify_tuner.study_files): beside an SQLite config database, an SQLite
file per key, so tuner processes on different keys never wait on one write lock; a PostgreSQL
config database keeps them itself. What an operator sets, mistypes, and runs twice."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import optuna
import pytest
from sqlalchemy import text
from verify_tuner.errors import BadSetting
from verify_tuner.measure.backend import Workload
from verify_tuner.search.study import StudyOptions, run_study
from verify_tuner.search.study_storage import open_study_storage
from verify_tuner.settings import Settings
from verify_tuner.store import migrate
from verify_tuner.store.session import make_engine, session_factory
from verify_tuner.study_files import STUDY, default_study_storage, study_file_url, study_urls

from tests.fakes import FakeBackend

RESTRICT = {"QT": [0], "WR": [2], "WK": [4], "SF": [0], "PIPE": [1]}


def test_the_default_is_a_file_per_key_beside_an_sqlite_config_database_and_postgresql_itself():
    assert (
        Settings(database_url="sqlite:////var/lib/tuner/configs.db").studies
        == "sqlite:////var/lib/tuner/configs.studies/{study}.db"
    )
    assert Settings(database_url="sqlite:///rel/configs.db").studies == "sqlite:///rel/configs.studies/{study}.db"
    pg = "postgresql+psycopg://tuner@db/tuner"
    assert Settings(database_url=pg).studies == pg
    assert default_study_storage("sqlite://") == "sqlite://"  # in memory: nothing beside it
    # an operator's choice wins: one shared file, or PostgreSQL for studies of an SQLite config DB
    env = {"TUNER_DATABASE_URL": "sqlite:////d/configs.db", "TUNER_STUDY_STORAGE": "sqlite:////d/optuna.db"}
    assert Settings.from_env(env).studies == "sqlite:////d/optuna.db"


@pytest.mark.parametrize(
    "url", ["postgresql://h/{study}", "sqlite:////x/{study}/a.db", "sqlite:////x/{study}-{study}.db", "not a url"]
)
def test_a_bad_study_storage_is_one_clear_setting_error(url):
    with pytest.raises(BadSetting, match="TUNER_STUDY_STORAGE") as exc:
        Settings.from_env({"TUNER_STUDY_STORAGE": url})
    assert "\n" not in str(exc.value)


def test_study_names_map_to_distinct_readable_file_names():
    t = "sqlite:////s/{study}.db"
    a = study_file_url(t, "verify-s6:NVIDIA H200|abc|bf16|H8|Q9|b6")
    assert a.startswith("sqlite:////s/verify-s6_NVIDIA_H200_abc_bf16_H8_Q9_b6-") and a.endswith(".db")
    # names that sanitise alike still get files of their own (the hash of the exact name)
    assert study_file_url(t, "x|y") != study_file_url(t, "x y")
    assert study_file_url("sqlite:////s/one.db", "anything") == "sqlite:////s/one.db"
    assert STUDY not in a


def test_listing_the_study_files_skips_sqlites_own_and_the_blank(tmp_path):
    for name in ("s-a", "s-a-wal", "s-a-shm", "s-b", "s-b-journal", ".blank-optuna-5.db", "other"):
        (tmp_path / name).touch()
    template = f"sqlite:///{tmp_path}/s-{STUDY}"
    assert study_urls(template) == [f"sqlite:///{tmp_path}/s-a", f"sqlite:///{tmp_path}/s-b"]
    assert study_urls(f"sqlite:///{tmp_path}/missing/{STUDY}.db") == []


def test_keys_get_files_of_their_own_and_a_rerun_resumes_its_file(tmp_path):
    url = f"sqlite:///{tmp_path / 'configs.db'}"
    migrate.upgrade(url)
    template = Settings(database_url=url).studies
    sessions = session_factory(make_engine(url))

    def tune(prefix: int, n: int):  # type: ignore[no-untyped-def]
        return run_study(
            backend=FakeBackend(),
            sessions=sessions,
            options=StudyOptions(storage_url=template, seed=0),
            n_trials=n,
            workload=Workload(8, 9, prefix),
            restrict=RESTRICT,
        )

    tune(4096, 6)
    key = tune(46000, 6).key
    files = study_urls(template)
    assert len(files) == 2 and all(
        Path(f.removeprefix("sqlite:///")).parent == tmp_path / "configs.studies" for f in files
    )
    assert sorted(len(optuna.get_all_study_summaries(storage=u)) for u in files) == [1, 1]
    with make_engine(url).connect() as c:  # the config database holds no Optuna tables of its own now
        assert c.execute(text("SELECT count(*) FROM sqlite_master WHERE name = 'trials'")).scalar() == 0
    tune(46000, 10)  # more budget for one key: its own file again, its 6 measured trials counted
    assert study_urls(template) == files
    st = optuna.load_study(study_name=key.study_name, storage=study_file_url(template, key.study_name))
    assert sum(1 for t in st.trials if t.user_attrs.get("measured")) == 10


def test_an_owner_and_a_helper_opening_a_new_study_file_at_once_both_get_it(tmp_path):
    """The first open creates Optuna's tables; two processes (here threads: flock excludes
    separate opens in one process too) racing on a fresh file must both succeed."""
    template = f"sqlite:///{tmp_path / 's' / '{study}.db'}"
    (tmp_path / "s").mkdir()
    errors: list[BaseException] = []
    go = threading.Barrier(4)

    def open_it() -> None:
        try:
            go.wait()
            storage = open_study_storage(template, "verify:k|b6")
            optuna.create_study(study_name="verify:k|b6", storage=storage, load_if_exists=True)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    (only,) = study_urls(template)  # the blank schema it was copied from is not a study
    assert [s.study_name for s in optuna.get_all_study_summaries(storage=only)] == ["verify:k|b6"]
    assert [p.name for p in (tmp_path / "s").glob(".blank-optuna-*.db")] == [f".blank-optuna-{optuna.__version__}.db"]
    with make_engine(only).connect() as c:
        assert c.execute(text("PRAGMA journal_mode")).scalar() == "wal"


def test_a_new_key_file_is_a_copy_of_a_blank_schema_and_takes_trials(tmp_path):
    """Optuna creating its schema in each key's file took 0.2-0.4 s a key (its alembic revisions
    loaded to stamp the version); a new file is a copy of one blank storage per directory."""
    template = f"sqlite:///{tmp_path / '{study}.db'}"
    for name in ("a", "b"):
        study = optuna.create_study(study_name=name, storage=open_study_storage(template, name))
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    blank = tmp_path / f".blank-optuna-{optuna.__version__}.db"
    with make_engine(f"sqlite:///{blank}").connect() as c:  # still blank: nothing was written to it
        assert c.execute(text("SELECT count(*) FROM studies")).scalar() == 0
        assert c.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    for url in study_urls(template):
        (summary,) = optuna.get_all_study_summaries(storage=url)
        assert summary.n_trials == 3
        with make_engine(url).connect() as c:
            assert c.execute(text("PRAGMA integrity_check")).scalar() == "ok"


def test_db_upgrade_makes_the_study_directory_and_its_blank_storage(tmp_path):
    from click.testing import CliRunner
    from verify_tuner.cli.commands import cli

    r = CliRunner().invoke(cli, ["db", "upgrade"], env={"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}"})
    assert r.exit_code == 0, r.output
    assert (tmp_path / "c.studies" / f".blank-optuna-{optuna.__version__}.db").is_file()  # the first key copies it


def test_db_upgrade_on_a_study_directory_it_cannot_write_is_one_line(tmp_path):
    """An operator's TUNER_STUDY_STORAGE under a directory this user cannot write (root loses its
    override here, as a container's non-root user would be)."""
    import shutil
    import subprocess
    import sys

    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: file modes do not apply")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner"]
    (tmp_path / "ro").mkdir(mode=0o500)
    env = {
        **os.environ,
        "TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}",
        "TUNER_STUDY_STORAGE": f"sqlite:///{tmp_path}/ro/s/{STUDY}.db",
    }
    r = subprocess.run(
        [*prefix, sys.executable, "-m", "tuner", "db", "upgrade"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,  # the refusal is what this test expects
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "cannot create" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
