"""`--devices 0,1`: one tuner process per GPU sharing one study (here with a CPU test double as the
measurer, and SQLite as the shared storage)."""

from __future__ import annotations

import collections

import optuna

from tuner.backend import Workload
from tuner.db import migrate, repo
from tuner.db.session import make_engine, session_factory, session_scope
from tuner.runner import TuneJob, tune_on_devices
from tuner.settings import Settings
from tuner.study import open_storage


def test_two_device_processes_share_the_trials_and_lose_none(sqlite_url, tmp_path):
    migrate.upgrade(sqlite_url)
    open_storage(sqlite_url)
    settings = Settings(database_url=sqlite_url, cache_dir=tmp_path / "cache")
    job = TuneJob(workloads=[Workload(8, 9, 46000)], n_trials=24, seed=0, measure_timeout_s=5,
                  restrict={"NSPLIT": [8, 16, 32, 64, 128]}, measurer="tests.fakes:MisbehavingMeasurer")
    results = tune_on_devices(settings, job, [0, 1])
    assert [(d, s) for d, s, _ in results] == [(0, "ok"), (1, "ok")], results
    assert all(len(payload) == 1 and payload[0]["best"] for _, _, payload in results)
    (summary,) = optuna.get_all_study_summaries(storage=sqlite_url)
    st = optuna.load_study(study_name=summary.study_name, storage=sqlite_url)
    assert all(t.state.is_finished() for t in st.trials)
    measured = [t for t in st.trials if t.user_attrs.get("measured")]
    assert len(measured) >= 24
    with session_scope(session_factory(make_engine(sqlite_url))) as s:
        (study_row,) = s.query(repo.Study).all()
        rows = [t for t in repo.list_trials(session=s, study_id=study_row.id) if t.state != "invalid"]
        assert len(repo.list_best(session=s)) == 1
    assert len(rows) >= len(measured), "a measured trial has no row in tuning_trials"
    dupes = sum(n - 1 for n in collections.Counter(tuple(sorted(t.params.items())) for t in measured).values())
    assert dupes <= len(measured) // 4, f"{dupes} duplicated measurements of {len(measured)}"
