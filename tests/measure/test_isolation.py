"""Crash isolation on CPU: a child that segfaults or hangs fails only its own measurement."""

from __future__ import annotations

import time

import pytest
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import LaunchError
from verify_tuner.measure.backend import CRASHED, OK, TIMEOUT, Workload
from verify_tuner.measure.gpu_backend import IsolatedBackend

WL = Workload(8, 9, 46000)
GOOD = KernelConfig(nsplit=64, ht=8, tk=32, block=256)


@pytest.fixture
def backend():
    b = IsolatedBackend(measurer="tests.fakes:MisbehavingMeasurer", timeout_s=3)
    yield b
    b.close()


def test_measures_in_a_child_process(backend):
    m = backend.measure(GOOD, WL)
    assert m.state == OK and m.median_us > 0
    assert backend._proc.pid != __import__("os").getpid()


def test_segfault_fails_one_measurement_and_the_worker_restarts(backend):
    m = backend.measure(KernelConfig(nsplit=2, ht=8, tk=32, block=256), WL)
    assert m.state == CRASHED and "SIGSEGV" in m.reason
    assert backend.restarts == 1
    assert backend.measure(GOOD, WL).state == OK


def test_hang_times_out_and_the_worker_restarts(backend):
    m = backend.measure(KernelConfig(nsplit=4, ht=8, tk=32, block=256), WL)
    assert m.state == TIMEOUT and "3 s" in m.reason
    assert backend.restarts == 1
    assert backend.measure(GOOD, WL).state == OK


def test_remeasure_failure_maps_to_every_candidate(backend):
    """A pool re-timed together fails together: the worker dies once, and each candidate gets the
    failure (one Measurement per config, as the winner phase expects), then the worker restarts."""
    from verify_tuner.measure.backend import CRASHED

    assert [m.state for m in backend.remeasure([GOOD, GOOD], WL, 2)] == [OK, OK]
    crashing = KernelConfig(nsplit=2, ht=8, tk=32, block=256)
    ms = backend.remeasure([GOOD, crashing, GOOD], WL, 2)
    assert [m.state for m in ms] == [CRASHED, CRASHED, CRASHED] and all(m.reason for m in ms)
    assert [m.state for m in backend.remeasure([GOOD], WL, 2)] == [OK]


def test_a_bug_in_the_measuring_code_raises_with_its_traceback(backend):
    from verify_tuner.measure.gpu_backend import MeasurerBug

    with pytest.raises(MeasurerBug) as info:
        backend.measure(KernelConfig(nsplit=12, ht=8, tk=32, block=256), WL)
    assert "ValueError: a deliberate bug in the measuring code" in str(info.value)
    assert "Traceback" in str(info.value) and "fakes.py" in str(info.value)


def test_a_bug_stops_the_study_instead_of_failing_a_trial(sessions, db_url):
    from verify_tuner.measure.gpu_backend import MeasurerBug
    from verify_tuner.search.study import StudyOptions, run_study

    b = IsolatedBackend(measurer="tests.fakes:MisbehavingMeasurer", timeout_s=3)
    try:
        with pytest.raises(MeasurerBug, match="deliberate bug"):
            run_study(
                backend=b,
                sessions=sessions,
                options=StudyOptions(storage_url=db_url, seed=3),
                workload=WL,
                n_trials=8,
                restrict={
                    "NSPLIT": [12],
                    "HT": [8],
                    "TK": [32],
                    "BLOCK": [256],
                    "STAGES": [2],
                    "QT": [0],
                    "WR": [2],
                    "WK": [4],
                    "SF": [0],
                    "PIPE": [1],
                },
            )
    finally:
        b.close()


def test_a_measurer_that_cannot_start_is_reported():
    """The constructor only starts the child (the caller's start overlaps it); the limits, the
    first thing any caller needs, report that it could not start."""
    b = IsolatedBackend(measurer="tests.fakes:NoSuchMeasurer", timeout_s=3)
    try:
        with pytest.raises(LaunchError, match="failed to start"):
            b.limits  # noqa: B018
    finally:
        b.close()


def test_study_goes_on_past_crashes_and_hangs(sessions, db_url):
    """A study whose search space includes crashing and hanging configs still finishes and stores."""
    from verify_tuner.search.study import StudyOptions, run_study
    from verify_tuner.store import studies
    from verify_tuner.store.session import session_scope

    b = IsolatedBackend(measurer="tests.fakes:MisbehavingMeasurer", timeout_s=3)
    try:
        out = run_study(
            backend=b,
            sessions=sessions,
            options=StudyOptions(storage_url=db_url, seed=3, sampler="grid"),
            workload=WL,
            n_trials=8,
            restrict={
                "NSPLIT": [2, 4, 64],
                "HT": [8],
                "TK": [32],
                "BLOCK": [256, 512],
                "STAGES": [2],
                "QT": [0],
                "WR": [2],
                "WK": [4],
                "SF": [0],
                "PIPE": [1],
            },  # every config of the grid
        )
    finally:
        b.close()
    with session_scope(sessions) as s:
        states = sorted(t.state for t in studies.list_trials(session=s, study_id=out.study_id))
    assert "crashed" in states and "timeout" in states and "ok" in states
    assert out.stored and out.best.nsplit == 64


def test_the_backend_returns_with_the_limits_while_the_measurer_still_starts(tmp_path):
    """A measurer with probe_limits: the caller gets the limits (to plan and compile) before the
    measurer's slow start ends; the first measurement waits for it, and the limits then carry
    what the start measured."""
    marker = tmp_path / "ready"
    t0 = time.monotonic()
    b = IsolatedBackend(measurer="tests.fakes:SlowStartMeasurer", measurer_kwargs={"marker": str(marker)}, timeout_s=10)
    try:
        assert time.monotonic() - t0 < 1.0, "the constructor waited for the child"
        assert b.limits.name == "NVIDIA H200" and b.limits.copy_bw_gbps is None
        assert not marker.exists(), "the constructor waited for the measurer's whole start"
        m = b.measure(KernelConfig(nsplit=64, ht=8, tk=32, block=256), WL)
        assert m.ok and marker.exists()
        assert b.limits.copy_bw_gbps == 4000.0
    finally:
        b.close()


def test_a_measurer_that_fails_after_its_limits_fails_the_first_call(tmp_path):
    b = IsolatedBackend(
        measurer="tests.fakes:SlowStartMeasurer",
        measurer_kwargs={"marker": str(tmp_path / "m"), "seconds": 0.1, "fail": True},
        timeout_s=10,
    )
    try:
        with pytest.raises(LaunchError, match="failed to start: RuntimeError: no CUDA context"):
            b.measure(KernelConfig(nsplit=64, ht=8, tk=32, block=256), WL)
    finally:
        b.close()


def test_closing_a_backend_whose_measurer_still_starts_does_not_wait_for_it(tmp_path):
    """A caller that stops early (its database not upgraded, say) closes the backend right after
    starting it: the child, which reads nothing until its start ends, is killed, not waited for."""
    b = IsolatedBackend(
        measurer="tests.fakes:SlowStartMeasurer",
        measurer_kwargs={"marker": str(tmp_path / "m"), "seconds": 20.0},
        timeout_s=10,
    )
    assert b.limits.name == "NVIDIA H200"  # the probe came; the rest of the start takes 20 s
    t0 = time.monotonic()
    b.close()
    assert time.monotonic() - t0 < 5.0
    assert not (tmp_path / "m").exists()
