"""A real study on the GPU, end to end, then the stored best read back through the API."""

from __future__ import annotations

import pytest
from verify_tuner.measure.backend import CRASHED, OK, TIMEOUT, Workload

pytestmark = pytest.mark.gpu


def _study(sqlite_url, tmp_path, workload: Workload, n_trials: int, **options):
    """A study on a fresh database, measured by the measuring child, which is closed after."""
    from verify_tuner.measure.gpu_backend import IsolatedBackend
    from verify_tuner.search.study import StudyOptions, run_study
    from verify_tuner.store import migrate
    from verify_tuner.store.session import make_engine, session_factory

    migrate.upgrade(sqlite_url)
    sessions = session_factory(make_engine(sqlite_url))
    backend = IsolatedBackend(measurer_kwargs={"cache_dir": str(tmp_path / "cache")}, timeout_s=120)
    try:
        out = run_study(
            backend=backend,
            sessions=sessions,
            options=StudyOptions(storage_url=sqlite_url, seed=0),
            workload=workload,
            n_trials=n_trials,
            **options,
        )
    finally:
        backend.close()
    return out, backend


def _served(sqlite_url, tmp_path, *queries: dict) -> list[dict]:
    """The sidecar's GET /config answers to `queries`, on the study's database."""
    from fastapi.testclient import TestClient
    from verify_tuner.api.app import create_app
    from verify_tuner.settings import Settings

    with TestClient(create_app(Settings(database_url=sqlite_url, cache_dir=tmp_path))) as c:
        return [c.get("/config", params=q).json() for q in queries]


def test_small_real_study_then_api(sqlite_url, tmp_path):
    out, backend = _study(sqlite_url, tmp_path, Workload(8, 9, 8192), 8)
    assert out.stored and out.best_m.median_us > 0 and out.default_m is not None
    (body,) = _served(sqlite_url, tmp_path, {"H": 8, "q_len": 9, "prefix": 8192})
    assert body["source"] == "tuned" and body["device"] == backend.limits.name
    assert (body["NSPLIT"], body["HT"], body["TK"], body["BLOCK"]) == (
        out.best.nsplit,
        out.best.ht,
        out.best.tk,
        out.best.block,
    )
    assert body["expected_us"] == pytest.approx(out.best_m.median_us)


def test_faulting_and_hanging_kernels_fail_only_their_trial(tmp_path):
    from verify_tuner.kernels.config import KernelConfig
    from verify_tuner.measure.gpu_backend import IsolatedBackend

    from tests.gpu_measurers import FAULT, HANG

    backend = IsolatedBackend(
        measurer="tests.gpu_measurers:FaultInjectingGpuMeasurer",
        measurer_kwargs={"cache_dir": str(tmp_path / "cache")},
        timeout_s=45,
    )
    try:
        wl = Workload(8, 9, 4096)
        fault = backend.measure(FAULT, wl)
        assert fault.state == CRASHED and "illegal" in fault.reason.lower(), fault.reason
        good = backend.measure(KernelConfig(nsplit=8, ht=8, tk=32, block=256), wl)
        assert good.state == OK
        hang = backend.measure(HANG, wl)
        assert hang.state == TIMEOUT
        assert backend.measure(KernelConfig(nsplit=16, ht=8, tk=32, block=256), wl).state == OK
        assert backend.restarts == 2
    finally:
        backend.close()


def test_a_batch_study_measures_the_ragged_batch_and_serves_its_bucket(sqlite_url, tmp_path):
    """B=8 on the GPU: the gate covers all 8 ragged requests, the winner is stored under batch
    bucket 5-8 and the API serves it for batch=8 while B=1 stays heuristic."""
    out, _ = _study(sqlite_url, tmp_path, Workload(8, 9, 8192, batch=8), 6, restrict={"STAGES": [2, 3], "QT": [0]})
    assert out.stored and out.key.batch_bucket == 3 and out.counts["ok"] >= 1
    b8, b1 = _served(
        sqlite_url, tmp_path, {"H": 8, "q_len": 9, "prefix": 8192, "batch": 8}, {"H": 8, "q_len": 9, "prefix": 8192}
    )
    assert b8["source"] == "tuned" and b8["NSPLIT"] == out.best.nsplit and b8["batch_bucket"]["hi"] == 8
    assert b1["source"] == "heuristic"


def test_a_study_timed_cold_measures_the_kernel_not_the_neighbour(sqlite_url, tmp_path):
    """Each launch followed by the 128 MB GEMM, its own time subtracted: the kernel's time under cold
    caches is near its back-to-back time (more, never the GEMM's ~30 us on top), the gate still
    runs, and the stored row and the sidecar say how it was timed."""
    from dataclasses import replace

    from fastapi.testclient import TestClient
    from verify_tuner.api.app import create_app
    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.measure.gpu_backend import IsolatedBackend
    from verify_tuner.search.study import StudyOptions, run_study
    from verify_tuner.settings import Settings
    from verify_tuner.store import migrate
    from verify_tuner.store.session import make_engine, session_factory

    migrate.upgrade(sqlite_url)
    sessions = session_factory(make_engine(sqlite_url))
    backend = IsolatedBackend(measurer_kwargs={"cache_dir": str(tmp_path / "cache")}, timeout_s=120)
    warm = Workload(8, 9, 4096)
    cold = replace(warm, neighbour_mb=128)
    try:
        default = heuristic_config(backend.limits, H=8, q_len=9, prefix=4096)
        b2b, c = backend.measure(default, warm), backend.measure(default, cold)
        assert b2b.state == OK and c.state == OK, (b2b, c)
        assert 0.8 * b2b.median_us < c.median_us < 2.5 * b2b.median_us, (b2b.median_us, c.median_us)
        other = replace(default, nsplit=66)
        ms = backend.remeasure([default, other], cold, 2)
        assert all(m.ok and 0 < m.median_us < 3 * b2b.median_us for m in ms), ms
        out = run_study(
            backend=backend,
            sessions=sessions,
            options=StudyOptions(storage_url=sqlite_url, seed=0),
            workload=cold,
            n_trials=4,
        )
    finally:
        backend.close()
    assert out.stored
    with TestClient(create_app(Settings(database_url=sqlite_url, cache_dir=tmp_path))) as client:
        body = client.get("/config", params={"H": 8, "q_len": 9, "prefix": 4096}).json()
    assert body["source"] == "tuned" and body["neighbour_mb"] == 128
    assert body["expected_us"] == pytest.approx(out.best_m.median_us)


def test_a_study_of_an_e4m3_cache_is_stored_and_served_under_its_kv_dtype(sqlite_url, tmp_path):
    """`tuner study start --kv-dtype fp8_e4m3` as the study runs it: trials gated against fp32 on
    the dequantized cache, the winner stored under kv_dtype fp8_e4m3 and served for that format
    only (the bf16 key stays the heuristic's)."""
    out, _ = _study(sqlite_url, tmp_path, Workload(8, 9, 8192, kv_dtype="fp8_e4m3"), 6)
    assert out.stored and out.best_m.median_us > 0
    e4m3, bf16 = _served(
        sqlite_url,
        tmp_path,
        {"H": 8, "q_len": 9, "prefix": 8192, "kv_dtype": "fp8_e4m3"},
        {"H": 8, "q_len": 9, "prefix": 8192},
    )
    assert (e4m3["source"], e4m3["kv_dtype"]) == ("tuned", "fp8_e4m3")
    assert e4m3["expected_us"] == pytest.approx(out.best_m.median_us)
    assert bf16["source"] == "heuristic"
