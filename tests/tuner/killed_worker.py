"""Body of a `study start`-like process that the kill -9 test kills mid-measurement (fake backend:
tests only)."""

from __future__ import annotations

from verify_tuner.measure.backend import Workload
from verify_tuner.search.study import StudyOptions, run_study
from verify_tuner.store.session import make_engine, session_factory

from tests.fakes import SlowFakeBackend

FIXED = {"QT": [0], "WR": [2], "WK": [4], "SF": [0], "PIPE": [1], "STAGES": [2], "BLOCK": [256]}


def run(url: str, marker: str, n_trials: int, seconds: float, parallel: int = 1) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    run_study(
        backend=SlowFakeBackend(marker, seconds=seconds),
        sessions=session_factory(make_engine(url)),
        options=StudyOptions(storage_url=url, seed=0, heartbeat_s=1.0, parallel=parallel),
        workload=Workload(8, 9, 46000),
        n_trials=n_trials,
        restrict=FIXED,
    )
