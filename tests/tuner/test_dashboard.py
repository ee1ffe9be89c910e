"""Optuna's own dashboard shows our studies (history, params, failure reasons): users get its
plots instead of ours. A CPU-only study (test double measurer) on a temp database, then
`optuna-dashboard <url>` as a process and its JSON API."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import optuna
import pytest
from verify_tuner.measure.backend import Workload
from verify_tuner.search.study import StudyOptions, run_study
from verify_tuner.store import migrate
from verify_tuner.store.session import make_engine, session_factory

from tests.fakes import FakeBackend
from tests.helpers import free_port


def _get(url: str):  # type: ignore[no-untyped-def]
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_optuna_dashboard_lists_our_study_with_params_and_reasons(sqlite_url, tmp_path):
    exe = shutil.which("optuna-dashboard") or os.path.join(os.path.dirname(sys.executable), "optuna-dashboard")
    if not os.path.exists(exe):
        pytest.fail("optuna-dashboard is not installed (it is in the dev extra)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    migrate.upgrade(sqlite_url)
    out = run_study(
        backend=FakeBackend(),
        sessions=session_factory(make_engine(sqlite_url)),
        options=StudyOptions(storage_url=sqlite_url, seed=0),
        workload=Workload(8, 9, 46000),
        n_trials=12,
        restrict={"QT": [0], "WR": [2], "WK": [4], "SF": [0], "PIPE": [1]},
    )
    port = free_port()
    proc = subprocess.Popen(
        [exe, sqlite_url, "--port", str(port), "--host", "127.0.0.1", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                studies = _get(f"{base}/api/studies")["study_summaries"]
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise AssertionError(f"dashboard did not answer: {proc.stderr.read() if proc.poll() else ''}")
        (summary,) = [s for s in studies if s["study_name"] == out.key.study_name]
        detail = _get(f"{base}/api/studies/{summary['study_id']}")
        trials = detail["trials"]
        assert len(trials) >= 12
        assert {p["name"] for p in trials[0]["params"]} >= {"NSPLIT", "HT", "TK", "BLOCK", "STAGES"}
        pruned = [t for t in trials if t["state"] == "Pruned"]  # configs validate() rejected
        assert pruned, "the search met no invalid config: the reasons below were not exercised"
        for t in pruned:  # each shows why it never ran
            (reason,) = [a["value"] for a in t["user_attrs"] if a["key"] == "reason"]
            assert reason and "state" in {a["key"] for a in t["user_attrs"]}
        assert any(t["state"] == "Complete" for t in trials)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
