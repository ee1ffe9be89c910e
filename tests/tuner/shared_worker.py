"""Body of one `study start`-like process for the shared-study test (fake backend: tests only)."""

from __future__ import annotations

import os

from verify_tuner.measure.backend import Workload
from verify_tuner.search.study import StudyOptions, run_study
from verify_tuner.store.session import make_engine, session_factory

from tests.fakes import FakeBackend


def run(url: str, seed: int, n_trials: int) -> tuple[int, int]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    fb = FakeBackend(seed=seed)
    run_study(
        backend=fb,
        sessions=session_factory(make_engine(url)),
        options=StudyOptions(storage_url=url, seed=seed),
        workload=Workload(8, 9, 46000),
        n_trials=n_trials,
    )
    return os.getpid(), len(fb.measured)
