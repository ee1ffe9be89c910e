"""Several tuner processes on one job (`--devices 0,1`, or one command per host on one
PostgreSQL): keys are shared out by claims, each winner is picked and stored once, nothing is
measured twice or lost. CPU test doubles measure (tests.fakes)."""

from __future__ import annotations

import collections
import datetime as dt
import sys
import time

import optuna
import pytest
from verify_tuner.jobs.runner import TuneJob, tune_on_devices
from verify_tuner.measure.backend import Workload
from verify_tuner.search.study import StudyOptions
from verify_tuner.search.study_storage import open_storage, prepare_study_storage
from verify_tuner.settings import Settings
from verify_tuner.store import best_configs, devices, migrate, models, studies
from verify_tuner.store.session import make_engine, session_factory, session_scope
from verify_tuner.study_files import study_urls

RESTRICT = {"NSPLIT": [8, 16, 32, 64, 128], "QT": [0], "WR": [2], "WK": [4], "SF": [0], "PIPE": [1]}


def _job(workloads, n_trials):  # type: ignore[no-untyped-def]
    # three trials in flight per process, as on a GPU host (verify_tuner.jobs.runner.default_compile_jobs)
    return TuneJob(
        workloads=workloads,
        n_trials=n_trials,
        seed=0,
        measure_timeout_s=10,
        restrict=RESTRICT,
        measurer="tests.fakes:PacedMeasurer",
        compile_jobs=3,
    )


def _measured_by_study(settings):  # type: ignore[no-untyped-def]
    """Each study's measured trials, from the storage the job used (a file per key on SQLite)."""
    out = {}
    for url in study_urls(settings.studies):
        for summary in optuna.get_all_study_summaries(storage=url):
            st = optuna.load_study(study_name=summary.study_name, storage=url)
            assert all(t.state.is_finished() for t in st.trials), "a trial was left running"
            assert summary.study_name not in out, f"{summary.study_name} is in two storages"
            out[summary.study_name] = [t for t in st.trials if t.user_attrs.get("measured")]
    return out


def _dupes(trials) -> int:  # type: ignore[no-untyped-def]
    return sum(n - 1 for n in collections.Counter(tuple(sorted(t.params.items())) for t in trials).values())


def test_ten_keys_on_two_processes_are_shared_out_and_stored_once(db_url, tmp_path):
    migrate.upgrade(db_url)
    settings = Settings(database_url=db_url, cache_dir=tmp_path / "cache")
    prepare_study_storage(settings.studies)  # as `tuner db upgrade`
    prefixes = [1024 * 2 ** (k / 2) for k in range(10)]
    workloads = [Workload(8, 9, round(p)) for p in prefixes]
    results = tune_on_devices(settings, _job(workloads, 8), [0, 1])
    assert [(r.device, r.ok) for r in results] == [(0, True), (1, True)], results
    owned = [k["key"] for r in results for k in r.keys]
    assert len(owned) == len(set(owned)) == 10, owned  # every key picked and stored exactly once
    assert all(r.keys for r in results), "one process did all the keys"
    measured_by_study = _measured_by_study(settings)
    assert len(measured_by_study) == 10
    for name, measured in measured_by_study.items():
        assert len(measured) >= 8, name
        assert _dupes(measured) == 0, f"{name}: {_dupes(measured)} duplicated measurements"
    with session_scope(session_factory(make_engine(db_url))) as s:
        assert len(best_configs.list_best(session=s)) == 10
        assert all(st.owner is None and st.status == "finished" for st in s.query(models.Study).all())
    # the same job again: every key is done, nothing is measured or stored again
    again = tune_on_devices(settings, _job(workloads, 8), [0, 1])
    assert sum(r.done_before for r in again) == 20 and not any(r.keys for r in again)


def test_one_key_on_two_processes_one_owns_the_other_helps(sqlite_url, tmp_path):
    migrate.upgrade(sqlite_url)
    settings = Settings(database_url=sqlite_url, cache_dir=tmp_path / "cache")
    prepare_study_storage(settings.studies)  # as `tuner db upgrade`
    results = tune_on_devices(settings, _job([Workload(8, 9, 46000)], 20), [0, 1])
    if errors := [r.error for r in results if r.error]:  # whole: an assertion's repr cuts a traceback short
        pytest.fail("\n".join(errors), pytrace=False)
    assert sorted(len(r.keys) for r in results) == [0, 1], results
    (measured,) = _measured_by_study(settings).values()  # owner and helper wrote one study file
    assert len(measured) >= 20 and _dupes(measured) == 0
    with session_scope(session_factory(make_engine(sqlite_url))) as s:
        assert len(best_configs.list_best(session=s)) == 1


def test_a_claim_is_exclusive_until_its_owner_stops_beating(sessions):
    from verify_tuner.kernels.limits import known_device
    from verify_tuner.keys import ConfigKey

    h200 = known_device("h200")
    key = ConfigKey(h200.name, "abc", "bf16", 8, 9, 15)
    now = dt.datetime.now(dt.UTC)
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=h200)
        sid = studies.get_or_create_study(session=s, key=key, prefix=46000, sampler="tpe", seed=None).id
        assert studies.claim_study(session=s, study_id=sid, owner="hostA:1:gpu0", stale_before=now - dt.timedelta(60))
        assert not studies.claim_study(
            session=s, study_id=sid, owner="hostB:2:gpu0", stale_before=now - dt.timedelta(seconds=30)
        )
        assert studies.beat_study(session=s, study_id=sid, owner="hostA:1:gpu0")
        # hostA dies: once its last beat is older than the stale limit, hostB takes the key over
        assert studies.claim_study(
            session=s, study_id=sid, owner="hostB:2:gpu0", stale_before=models.utcnow() + dt.timedelta(seconds=1)
        )
        assert not studies.beat_study(session=s, study_id=sid, owner="hostA:1:gpu0")  # A learns it lost it
        studies.release_study(session=s, study_id=sid, owner="hostB:2:gpu0")
        assert studies.find_study(session=s, key=key).owner is None


@pytest.mark.postgres
def test_two_hosts_share_a_job_through_postgresql(pg_url, tmp_path):
    """The same job started as two separate processes (as on two machines: their own owner ids,
    no parent in common) against one PostgreSQL shares its keys out."""
    import json
    import os
    import subprocess
    import sys

    migrate.upgrade(pg_url)
    open_storage(pg_url)
    script = (
        "import json, sys; from tests.tuner.host_worker import run; print(json.dumps(run(sys.argv[1], sys.argv[2])))"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, pg_url, str(tmp_path / f"cache{i}")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-1500:] for _, e in outs]
    owned = [k for o, _ in outs for k in json.loads(o.strip().splitlines()[-1])]
    assert len(owned) == len(set(owned)) == 6
    with session_scope(session_factory(make_engine(pg_url))) as s:
        assert len(best_configs.list_best(session=s)) == 6


def test_a_key_its_owner_finishes_between_scan_and_claim_is_not_tuned_again(db_url, monkeypatch):
    """The interleaving that tuned a key twice (2 of 6 runs of the 10-key test on PostgreSQL):
    another process finishes the key and releases its claim just before this process's claim
    UPDATE. The claim then succeeds, and the check that follows it must see the key done."""
    from verify_tuner.jobs import claims
    from verify_tuner.kernels.limits import known_device
    from verify_tuner.search.study import workload_key

    migrate.upgrade(db_url)
    sessions = session_factory(make_engine(db_url))
    wl, limits = Workload(8, 9, 4096), known_device("h200")
    key = workload_key(limits, wl)
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=limits)
    with session_scope(sessions) as s:  # the other owner is mid-search
        row = studies.get_or_create_study(session=s, key=key, prefix=wl.prefix, sampler="tpe", seed=0, reopen=False)
        row.n_ok, sid = 8, row.id
    with session_scope(sessions) as s:
        assert studies.claim_study(session=s, study_id=sid, owner="other", stale_before=models.utcnow())
    real_claim = studies.claim_study

    def claim_after_the_owner_finished(*, session, study_id, owner, stale_before):  # type: ignore[no-untyped-def]
        with session_scope(sessions) as s2:
            studies.finish_study(session=s2, study_id=study_id)
            studies.release_study(session=s2, study_id=study_id, owner="other")
        return real_claim(session=session, study_id=study_id, owner=owner, stale_before=stale_before)

    monkeypatch.setattr(studies, "claim_study", claim_after_the_owner_finished)
    assert claims._claim(sessions, key, wl, "me", 8, StudyOptions(storage_url=db_url, seed=0)) == claims._DONE
    with session_scope(sessions) as s:
        row = s.get(models.Study, sid)
        assert row.owner is None and row.status == "finished"


@pytest.mark.parametrize(("left", "helps"), [(6, False), (7, True)])
def test_an_idle_process_helps_only_a_key_with_more_places_left_than_twice_its_owners_trials_in_flight(
    sqlite_url, monkeypatch, left, helps
):
    """With 3 trials in flight per process, an owner's own trials take a key's last 3 places and
    a helper's would take 3 more, counted by neither: an idle process waits for a key with 6
    places left (it would add proposals, storage writes and measurements past the budget), and
    joins one with 7."""
    from verify_tuner.jobs import claims
    from verify_tuner.kernels.limits import known_device
    from verify_tuner.search.study import workload_key

    from tests.fakes import FakeBackend

    migrate.upgrade(sqlite_url)
    sessions = session_factory(make_engine(sqlite_url))
    wl, limits, budget = Workload(8, 9, 4096), known_device("h200"), 8
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=limits)
    with session_scope(sessions) as s:  # a live owner is mid-search
        row = studies.get_or_create_study(
            session=s, key=workload_key(limits, wl), prefix=wl.prefix, sampler="tpe", seed=0, reopen=False
        )
        row.n_ok, sid = budget - left, row.id
    with session_scope(sessions) as s:
        assert studies.claim_study(session=s, study_id=sid, owner="other", stale_before=models.utcnow())
    calls = []

    def owner_finishes() -> None:
        with session_scope(sessions) as s:
            row = s.get(models.Study, sid)
            row.n_ok = budget
            studies.finish_study(session=s, study_id=sid)
            studies.release_study(session=s, study_id=sid, owner="other")

    def helper_search(**kw):  # type: ignore[no-untyped-def]
        calls.append(kw)
        owner_finishes()

    monkeypatch.setattr(claims, "run_study", helper_search)

    def owner_finishes_during_the_wait(*args):  # type: ignore[no-untyped-def]
        time.sleep(0.3)
        owner_finishes()

    monkeypatch.setattr(claims, "_wait_for_a_release", owner_finishes_during_the_wait)
    t0 = time.monotonic()
    res = claims.run_job(
        backend=FakeBackend(),
        sessions=sessions,
        workloads=[wl],
        n_trials=budget,
        owner="me",
        options=StudyOptions(storage_url=sqlite_url, seed=0, parallel=3),
    )
    elapsed = time.monotonic() - t0
    assert [c["pick"] for c in calls] == ([False] if helps else [])
    assert res.done_before == [wl] and not res.outcomes
    assert res.helped == ([wl] if helps else [])
    # what it did not help, and that it waited for the owner instead
    assert res.declined == ({} if helps else {wl: left})
    assert (res.waited_s == 0.0) if helps else (0.3 <= res.waited_s < elapsed), (res.waited_s, elapsed)


@pytest.mark.parametrize(
    ("place", "order"), [((0, 1), [0, 1, 2, 3, 4]), ((1, 2), [2, 3, 4, 0, 1]), ((2, 3), [3, 4, 0, 1, 2])]
)
def test_a_process_walks_the_keys_from_its_own_place_and_wraps_around(sqlite_url, monkeypatch, place, order):
    """Process i of P starts at key i*K/P, so each goes on to its own last key's neighbour (whose
    best and compiles are there to start from), as a lone process does."""
    from verify_tuner.jobs import claims

    from tests.fakes import FakeBackend

    migrate.upgrade(sqlite_url)
    sessions = session_factory(make_engine(sqlite_url))
    workloads = [Workload(8, 9, 1024 * 2**k) for k in range(5)]
    monkeypatch.setattr(claims, "run_study", lambda **kw: kw["workload"])
    res = claims.run_job(
        backend=FakeBackend(),
        sessions=sessions,
        workloads=workloads,
        n_trials=4,
        owner="me",
        options=StudyOptions(storage_url=sqlite_url, seed=0),
        place=place,
    )
    assert res.outcomes == [workloads[k] for k in order]


def test_a_place_outside_the_processes_is_an_error(sqlite_url):
    from verify_tuner.jobs import claims

    from tests.fakes import FakeBackend

    migrate.upgrade(sqlite_url)
    with pytest.raises(ValueError, match="index must be in"):
        claims.run_job(
            backend=FakeBackend(),
            sessions=session_factory(make_engine(sqlite_url)),
            workloads=[Workload(8, 9, 4096)],
            n_trials=4,
            owner="me",
            options=StudyOptions(storage_url=sqlite_url),
            place=(2, 2),
        )


def test_gpu_processes_fork_only_from_a_single_threaded_process():
    """Forked, the per-GPU processes start at once (spawned, each imports the CLI's modules
    again); a fork while another thread runs could inherit a lock held forever, so then they
    are spawned."""
    import os
    import threading

    from verify_tuner.jobs.runner import _start_method

    if os.name == "posix" and threading.active_count() == 1 and "pycuda.driver" not in sys.modules:
        assert _start_method() == "fork"  # (a GPU test earlier in this session imports PyCUDA: then spawn)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert _start_method() == "spawn"
    finally:
        stop.set()
        t.join()


def test_a_process_waiting_on_owned_keys_goes_on_when_one_is_released_not_a_poll_later(sessions):
    # the job's last process used to sleep POLL_S (1 s) between scans: a key another process
    # finished just after the scan kept it waiting, and the job ended 0.8 s later on two GPUs
    import threading
    import time

    from verify_tuner.jobs import claims
    from verify_tuner.kernels.limits import known_device
    from verify_tuner.keys import ConfigKey

    h200 = known_device("h200")
    keys = [ConfigKey(h200.name, "abc", "bf16", 8, 9, b) for b in (14, 15)]
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=h200)
        ids = [studies.get_or_create_study(session=s, key=k, prefix=46000, sampler="tpe", seed=None).id for k in keys]
        for sid in ids:
            assert studies.claim_study(session=s, study_id=sid, owner="other", stale_before=models.utcnow())

    t0 = time.monotonic()
    claims._wait_for_a_release(
        sessions, [k.study_label() for k in keys], 0.3
    )  # nobody releases: back after the timeout
    assert 0.3 <= time.monotonic() - t0 < 3

    def release() -> None:
        with session_scope(sessions) as s:
            studies.release_study(session=s, study_id=ids[1], owner="other")

    timer = threading.Timer(0.2, release)
    timer.start()
    t0 = time.monotonic()
    claims._wait_for_a_release(sessions, [k.study_label() for k in keys], 30.0)
    timer.join()
    assert 0.2 <= time.monotonic() - t0 < 5  # on the release, not at the 30 s timeout
    with session_scope(sessions) as s:
        assert studies.owners_of(session=s, workload_keys=[str(k) for k in keys]) == {
            str(keys[0]): "other",
            str(keys[1]): None,
        }


def test_the_cli_says_per_gpu_what_it_owned_helped_and_waited_for(monkeypatch, capsys, tmp_path):
    """`tuner study start --devices`: one summary line per GPU; a failed GPU is reported and the
    command exits non-zero."""
    import click
    from verify_tuner.cli import study as cli_study
    from verify_tuner.jobs import runner

    payload = {
        "keys": [],
        "helped": 0,
        "done_before": 5,
        "waited_s": 7.9,
        "declined": [{"prefix": 38968, "batch": 1, "places_left": 12}],
    }
    results = [runner.DeviceResult(0, **payload), runner.DeviceResult(1, error="TunerError: boom")]
    monkeypatch.setattr(runner, "tune_on_devices", lambda *a: results)
    with pytest.raises(click.ClickException, match="1 of 2 GPUs' tuners failed .*the others' results are stored"):
        cli_study._start_on_devices(Settings(database_url="sqlite://", cache_dir=tmp_path), None, [0, 1], False)
    out, err = capsys.readouterr()
    every = [runner.DeviceResult(0, error="TunerError: boom"), runner.DeviceResult(1, error="TunerError: boom")]
    monkeypatch.setattr(runner, "tune_on_devices", lambda *a: every)
    with pytest.raises(click.ClickException, match=r"every GPU's tuner failed \(2, see above\); nothing was tuned"):
        cli_study._start_on_devices(Settings(database_url="sqlite://", cache_dir=tmp_path), None, [0, 1], False)
    assert (
        "GPU 0: owned 0 key(s), helped with 0, left 5 to the other processes or to an earlier run, waited 7.9 s "
        "for keys other processes owned (not helped: prefix=38968 batch=1 with 12 places left)"
    ) in out
    assert "GPU 1: failed: TunerError: boom" in err


def test_one_gpu_of_a_job_other_hosts_share_says_what_it_waited_for(monkeypatch, capsys, tmp_path):
    """`tuner study start` on one GPU, the same job running on another host: its output (text and
    --json) says how long it waited for the other's keys, as each GPU's line does on one host."""
    import json

    from verify_tuner.cli import study as cli_study
    from verify_tuner.jobs import runner
    from verify_tuner.jobs.claims import JobResult

    res = JobResult(waited_s=2.04, declined={Workload(8, 9, 4096): 3})
    monkeypatch.setattr(runner, "tune_on_device", lambda *a, **kw: res)
    settings = Settings(database_url="sqlite://", cache_dir=tmp_path)
    cli_study._start_on_one(settings, None, 0, True)
    out = json.loads(capsys.readouterr().out)
    assert out["waited_s"] == 2.0 and out["declined"] == [{"prefix": 4096, "batch": 1, "places_left": 3}]
    cli_study._start_on_one(settings, None, 0, False)
    assert (
        "waited 2.0 s for keys other processes owned (not helped: prefix=4096 batch=1 with 3 places left)"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize("failure", [KeyboardInterrupt, RuntimeError])
def test_a_search_that_fails_or_is_interrupted_lets_its_key_go(sqlite_url, monkeypatch, failure):
    """Ctrl-C (or a failed search) kept the claim: the re-run waited out its 30 s expiry for a
    process that no longer existed."""
    from verify_tuner.jobs import claims
    from verify_tuner.kernels.limits import known_device
    from verify_tuner.search.study import workload_key

    from tests.fakes import FakeBackend

    migrate.upgrade(sqlite_url)
    sessions = session_factory(make_engine(sqlite_url))
    wl, limits = Workload(8, 9, 4096), known_device("h200")
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=limits)
    seen = []

    def interrupted(**kw):  # type: ignore[no-untyped-def]
        with session_scope(sessions) as s:  # it holds the key while it searches
            seen.append(studies.find_study(session=s, key=workload_key(limits, wl)).owner)
        raise failure("stopped")

    monkeypatch.setattr(claims, "run_study", interrupted)
    with pytest.raises(failure):
        claims.run_job(
            backend=FakeBackend(),
            sessions=sessions,
            workloads=[wl],
            n_trials=8,
            owner="me",
            options=StudyOptions(storage_url=sqlite_url, seed=0),
        )
    with session_scope(sessions) as s:
        assert seen == ["me"] and studies.find_study(session=s, key=workload_key(limits, wl)).owner is None
