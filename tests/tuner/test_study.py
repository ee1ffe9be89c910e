"""The tuner's logic on CPU with the fake timing backend (a test double)."""

from __future__ import annotations

import optuna
import pytest
from verify_tuner import space
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.validate import check
from verify_tuner.measure.backend import Workload
from verify_tuner.search.study import StudyOptions, run_study
from verify_tuner.store import best_configs, devices, models, studies
from verify_tuner.store.session import session_scope

from tests.fakes import H200, FakeBackend, fake_cost

optuna.logging.set_verbosity(optuna.logging.WARNING)
WL = Workload(8, 9, 46000)
#: The fake landscape depends on the four core constants and STAGES only: the searches here fix
#: kernel v2's structural choices at the heuristic's for WL (the seesaw: 3 slots, 256 threads, 2x2
#: folded), so a few dozen trials explore what the assertions are about (the structural dimensions
#: are exercised by test_space_* below).
FIXED = {"QT": [0], "WR": [2], "WK": [2], "SF": [1], "PIPE": [3], "STAGES": [3], "BLOCK": [256]}


def study(sessions, db_url, backend, **kw):
    kw.setdefault("n_trials", 25)
    kw["restrict"] = {**FIXED, **kw.get("restrict", {})}
    option_names = ("sampler", "seed", "parallel", "timeout_s", "warm_start")
    options = StudyOptions(storage_url=db_url, **{"seed": 1, **{k: kw.pop(k) for k in option_names if k in kw}})
    return run_study(backend=backend, sessions=sessions, options=options, workload=kw.pop("workload", WL), **kw)


def trials(sessions, study_id):
    with session_scope(sessions) as s:
        return studies.list_trials(session=s, study_id=study_id)


def test_search_stores_a_valid_winner_with_speedup(sessions, db_url):
    fb = FakeBackend()
    out = study(sessions, db_url, fb, n_trials=40)  # the default is 1.27x off the fake optimum
    assert out.stored and out.best is not None
    assert check(out.best, H200, H=8, q_len=9) is None
    assert out.speedup and out.speedup > 1
    with session_scope(sessions) as s:
        row = best_configs.get_best(session=s, key=out.key)
    assert row.config == out.best and row.default_us == pytest.approx(out.default_m.median_us)
    assert row.speedup == pytest.approx(out.speedup)
    assert out.best.nsplit not in (12, 24)  # wrong / crashed configs never win


def test_a_format_the_device_cannot_run_is_refused_with_its_reason_before_a_search(sessions, db_url):
    """`study start --kv-dtype fp8_e4m3_qk` on an A100 said "no valid config for H=8, q_len=9", as if the
    shape were impossible: the format's own reason comes first, and nothing is measured or stored."""
    from verify_tuner.kernels.limits import known_device

    fb = FakeBackend(limits=known_device("a100"))
    with pytest.raises(
        InvalidConfig, match=r"kv_dtype fp8_e4m3_qk needs compute capability 8\.9\+, the device has 8\.0"
    ):
        study(sessions, db_url, fb, workload=Workload(8, 9, 46000, kv_dtype="fp8_e4m3_qk"))
    assert fb.measured == [] and fb.compiled == []
    with session_scope(sessions) as s:
        assert s.query(models.Study).count() == 0


def test_invalid_configs_never_reach_the_backend_and_do_not_use_the_budget(sessions, db_url):
    fb = FakeBackend()
    out = study(sessions, db_url, fb, n_trials=20, restrict={"STAGES": [2, 3, 4], "BLOCK": [128, 256, 512]})
    rows = trials(sessions, out.study_id)
    invalid = [t for t in rows if t.state == "invalid"]
    measured_in_search = len(rows) - len(invalid)
    assert measured_in_search == 20  # budget counts measurements only
    assert invalid and all(t.reason for t in invalid)
    # FakeBackend.measure asserts it never sees an invalid config


def test_refused_proposals_are_pruned_trials_with_their_reason_and_logged(sessions, db_url):
    # the whole space: most of what TPE proposes does not fit; each refusal is told to Optuna as a
    # pruned trial (TPE learns from it) and the config nearest it that fits is proposed next
    from sqlalchemy import event

    commits = []
    event.listen(sessions.kw["bind"], "commit", lambda conn: commits.append(1))
    fb = FakeBackend()
    out = run_study(
        backend=fb, sessions=sessions, options=StudyOptions(storage_url=db_url, seed=2), workload=WL, n_trials=20
    )
    st = optuna.load_study(study_name=out.key.study_name, storage=db_url)
    refused = [t for t in st.trials if t.user_attrs.get("state") == "invalid"]
    assert refused and all(
        t.state == optuna.trial.TrialState.PRUNED
        and t.user_attrs.get("reason")
        and check(KernelConfig.from_params(t.params), H200, H=8, q_len=9) is not None
        for t in refused
    )
    # refused configs' rows go to the config database with the measurements, not a commit each
    assert len(commits) < len(refused) + 20
    logged = [t for t in trials(sessions, out.study_id) if t.state == "invalid"]
    assert len(logged) == len(refused) and all(t.reason for t in logged)
    taken = [t for t in st.trials if t.user_attrs.get("measured")]
    assert all(check(KernelConfig.from_params(t.params), H200, H=8, q_len=9) is None for t in taken)
    assert len(fb.measured) >= 12


def test_a_refusal_is_followed_by_the_nearest_config_that_fits(sessions, db_url):
    # the whole space at H=8 q=9: 5.5 % of the structures fit. The start draws among the configs
    # that fit, and each refused TPE proposal is followed by the nearest config that fits: TPE's
    # refusals alone (the search before) took 93 proposals for 20 measurements, 73 % refused
    fb = FakeBackend()
    out = run_study(
        backend=fb, sessions=sessions, options=StudyOptions(storage_url=db_url, seed=0), workload=WL, n_trials=20
    )
    st = optuna.load_study(study_name=out.key.study_name, storage=db_url)
    refused = [t for t in st.trials if t.user_attrs.get("state") == "invalid"]
    assert len(refused) <= 0.5 * len(st.trials), f"{len(refused)} of {len(st.trials)} refused"
    assert len(st.trials) < 45
    by_number = {t.number: t for t in st.trials}
    for t in refused:
        after = by_number.get(t.number + 1)
        if after is not None and after.user_attrs.get("measured"):
            assert check(KernelConfig.from_params(after.params), H200, H=8, q_len=9) is None


def test_the_search_proposes_qt_row_tiles(sessions, db_url):
    # QT's row tiles (2, 3, 5 at q_len=9) are 70 % of the valid space: searched (space 7), and
    # `--only QT=3` is a search of its own, where it once failed as not a candidate
    fb = FakeBackend()
    out = study(sessions, db_url, fb, n_trials=20, restrict={"QT": [0, 2, 3, 5]})
    assert {c.qt for c in fb.measured} > {0}
    fb = FakeBackend()
    out = study(sessions, db_url, fb, n_trials=6, restrict={"QT": [3]}, workload=Workload(8, 9, 4000))
    assert {c.qt for c in fb.measured if c != out.default} == {3}  # the default is measured to compare
    assert out.best.qt == 3 or out.best == out.default


def test_failed_trials_are_recorded_with_reasons(sessions, db_url):
    # the default (NSPLIT=132, measured first) computes wrong results; the fake optimum crashes
    fb = FakeBackend(wrong_nsplit=132, crash_nsplit=64)
    out = study(sessions, db_url, fb, n_trials=30, restrict={"NSPLIT": [64, 96, 128, 132]})
    states = {t.state for t in trials(sessions, out.study_id)}
    assert {"wrong", "crashed"} <= states
    rows = [t for t in trials(sessions, out.study_id) if t.state in ("wrong", "crashed")]
    assert all(t.reason for t in rows) and out.best.nsplit not in (132, 64)
    # a failed measurement is a pruned trial, which TPE ranks among the worst: failed, it was
    # invisible to TPE, which proposed the same crashing config 596 times (answered from storage)
    st = optuna.load_study(study_name=out.key.study_name, storage=db_url)
    measured = [t for t in st.trials if t.user_attrs.get("measured")]
    assert {t.state for t in measured if t.user_attrs["state"] != "ok"} == {optuna.trial.TrialState.PRUNED}
    again = [t for t in st.trials if "reused_trial" in t.user_attrs and t.user_attrs.get("state") != "ok"]
    assert len(again) <= len(measured) // 2, f"{len(again)} proposals of configs that failed before"


def test_repeated_params_are_answered_from_storage(sessions, db_url):
    fb = FakeBackend()
    out = study(sessions, db_url, fb, n_trials=30)
    search = [t for t in trials(sessions, out.study_id) if t.state != "invalid"]
    keys = [tuple(sorted(t.params.items())) for t in search]
    assert len(keys) == 30 and len(keys) == len(set(keys)), "a parameter set was measured twice"
    st = optuna.load_study(study_name=out.key.study_name, storage=db_url)
    reused = [t for t in st.trials if "reused_trial" in t.user_attrs]
    assert reused, "TPE on a small space must have proposed a measured config again"
    for t in reused:
        src = st.trials[t.user_attrs["reused_trial"]]
        assert t.params == src.params and (t.value == src.value or t.value is None)


def _store_neighbour(sessions) -> KernelConfig:
    """A stored best of the neighbouring prefix bucket (14) of WL's key, in FIXED's space: the warm start's second config."""
    neighbour = KernelConfig(nsplit=96, ht=4, tk=16, block=256, stages=3, wk=2, sf=1, pipe=3)
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=H200)
        from verify_tuner.kernels import kernel_hash
        from verify_tuner.keys import ConfigKey

        best_configs.upsert_best(
            session=s,
            row=best_configs.BestRow(ConfigKey(H200.name, kernel_hash(), "bf16", 8, 9, 14), neighbour, median_us=30.0),
        )
    return neighbour


def test_warm_start_measures_the_default_then_neighbours_first(sessions, db_url):
    fb = FakeBackend()
    neighbour = _store_neighbour(sessions)
    study(sessions, db_url, fb, n_trials=5)
    assert fb.measured[0] == heuristic_config(H200, H=8, q_len=9, prefix=46000)
    assert fb.measured[1] == neighbour


def test_a_cold_search_starts_from_tpe_and_still_compares_the_winner_with_the_default(sessions, db_url):
    # bench/tpe_efficiency.py --cold: the search quality of TPE on its own, without the heuristic
    # default and the neighbours' bests as its first trials; the winner phase still re-times the default
    fb = FakeBackend()
    neighbour = _store_neighbour(sessions)
    default = heuristic_config(H200, H=8, q_len=9, prefix=46000)
    out = study(sessions, db_url, fb, n_trials=5, warm_start=False)
    search = fb.measured[:5]  # the winner phase measures (or re-times) after the search's five
    assert search[0] not in (default, neighbour) and neighbour not in search
    winner_phase = fb.measured[5:] + [c for batch in fb.remeasured for c in batch]
    assert default in winner_phase, "the winner phase must time the default"
    assert out.default == default and out.stored


def test_a_search_restricted_away_from_a_faster_default_stores_the_default(sessions, db_url):
    # `--only NSPLIT=1,2`: every config the search may try is slower than the heuristic's default
    # (NSPLIT=132 here), which the winner phase gates and times; the default must win, not the
    # fastest of the search's top configs
    fb = FakeBackend()
    out = study(sessions, db_url, fb, n_trials=6, restrict={"NSPLIT": [1, 2]})
    default = heuristic_config(H200, H=8, q_len=9, prefix=46000)
    assert out.default == default and default.nsplit not in (1, 2)
    assert out.stored and out.best == default and out.speedup == pytest.approx(1.0)
    with session_scope(sessions) as s:
        assert best_configs.get_best(session=s, key=out.key).config == default


def test_resume_reuses_measurements(sessions, db_url):
    first = study(sessions, db_url, FakeBackend(), n_trials=15)
    fb2 = FakeBackend(seed=5)
    second = study(sessions, db_url, fb2, n_trials=15)
    assert second.study_id == first.study_id and second.key == first.key
    assert fb2.measured == [], "the resumed study re-ran a search measurement"
    fb3 = FakeBackend(seed=6)
    third = study(sessions, db_url, fb3, n_trials=20)  # a larger budget: only the difference is measured
    assert len(fb3.measured) == 5
    assert len([t for t in trials(sessions, third.study_id) if t.state != "invalid"]) == 20


def test_grid_sampler_sweeps_every_valid_config(sessions, db_url):
    restrict = {**FIXED, "NSPLIT": [16, 64, 128], "TK": [32, 64]}
    valid = space.valid_configs(H200, H=8, q_len=9, restrict=restrict)
    fb = FakeBackend(wrong_nsplit=-1, crash_nsplit=-1, noise=0.0)
    out = study(sessions, db_url, fb, n_trials=10_000, sampler="grid", restrict=restrict)
    # every grid point measured exactly once; the default (here inside the grid) is not re-measured
    assert sorted(fb.measured) == sorted(set(valid) | {out.default})
    assert out.best == min(valid, key=lambda c: fb.cost(c, WL))


def test_stored_best_is_kept_when_the_new_winner_is_within_noise(sessions, db_url):
    fb = FakeBackend(noise=0.0)
    out = study(sessions, db_url, fb, n_trials=25)
    incumbent = out.best
    # Everything now measures identical but for tiny noise: a challenger cannot displace it.
    flat = FakeBackend(noise=0.05, cost=lambda c, w: 30.0, seed=9)
    again = run_study(
        backend=flat, sessions=sessions, options=StudyOptions(storage_url=db_url, seed=2), workload=WL, n_trials=25
    )
    assert "kept stored best" in again.decision or again.best == incumbent
    with session_scope(sessions) as s:
        assert best_configs.get_best(session=s, key=out.key).config == incumbent


def test_a_clearly_faster_config_replaces_the_stored_best(sessions, db_url):
    from verify_tuner.buckets import bucket_of
    from verify_tuner.kernels import kernel_hash
    from verify_tuner.keys import ConfigKey

    slow_best = KernelConfig(nsplit=8, ht=1, tk=16, block=128, wr=1, wk=4)
    key = ConfigKey(H200.name, kernel_hash(), "bf16", 8, 9, bucket_of(46000).index)
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=H200)
        best_configs.upsert_best(session=s, row=best_configs.BestRow(key, slow_best, median_us=1000.0))
    fb = FakeBackend(noise=0.0)
    out = study(sessions, db_url, fb, n_trials=25)
    assert out.decision == "stored new best" and out.best != slow_best
    assert slow_best in fb.remeasured[-1], "the incumbent must be re-timed beside the challengers"
    with session_scope(sessions) as s:
        assert best_configs.get_best(session=s, key=key).config == out.best


def batch_cost(cfg: KernelConfig, wl: Workload) -> float:
    """A landscape where the best NSPLIT fills one wave whatever the batch (its parts share the
    batch out), and a batch costs its requests' work."""
    import math

    return (20.0 + 6 * abs(math.log2(cfg.nsplit / 132))) * (1 + wl.prefix * wl.batch / 100_000)


def test_a_batch_study_is_its_own_key_and_warm_starts_from_b1(sessions, db_url):
    """B=32 tunes its own key (batch bucket 17-32), and leaves the B=1
    row alone; the B=1 winner, as stored, is among the B=32 study's warm-start candidates."""
    b1 = study(sessions, db_url, FakeBackend(cost=batch_cost), n_trials=20)
    fb = FakeBackend(cost=batch_cost)
    wl32 = Workload(8, 9, 46000, batch=32)
    b32 = study(sessions, db_url, fb, n_trials=20, workload=wl32)
    assert (b1.key.batch_bucket, b32.key.batch_bucket) == (0, 5) and b32.key.bucket == b1.key.bucket
    assert b32.stored and 64 <= b32.best.nsplit <= 2 * 132 and b1.best.nsplit >= 64
    assert b1.best in fb.measured[:6]  # enqueued from the neighbouring batch bucket, as stored
    with session_scope(sessions) as s:
        assert best_configs.get_best(session=s, key=b1.key).config == b1.best
        assert best_configs.get_best(session=s, key=b32.key).config == b32.best
        assert s.get(models.Study, b32.study_id).batch_bucket == 5


def test_batch_workloads_draw_reproducible_ragged_prefixes():
    from verify_tuner import batches

    wl = Workload(8, 9, 46000, batch=16)
    lens = wl.prefix_lens()
    assert lens == Workload(8, 9, 46000, batch=16).prefix_lens() and len(lens) == 16
    assert batches.prefix_of(lens) == 46000 and min(lens) < 46000 * 0.8  # ragged, longest = the key's prefix
    assert Workload(8, 9, 46000, batch=4, spread="equal").prefix_lens() == [46000] * 4
    with pytest.raises(ValueError, match="batch"):
        Workload(8, 9, 46000, batch=0)


class _ThreadedBackend(FakeBackend):
    """FakeBackend that takes a little while to compile and to measure, and counts how many
    compiles and measurements overlap (the tuner must never run two measurements at once)."""

    def __init__(self, **kw) -> None:  # type: ignore[no-untyped-def]
        import threading

        super().__init__(**kw)
        self.lock = threading.Lock()
        self.compiling = self.measuring = self.max_compiling = self.max_measuring = 0

    def _enter(self, what: str, seconds: float) -> None:
        import time

        with self.lock:
            setattr(self, what, getattr(self, what) + 1)
            setattr(self, f"max_{what}", max(getattr(self, f"max_{what}"), getattr(self, what)))
        time.sleep(seconds)
        with self.lock:
            setattr(self, what, getattr(self, what) - 1)

    def compile_ahead(self, cfg, workload):  # type: ignore[no-untyped-def]
        self._enter("compiling", 0.4)
        super().compile_ahead(cfg, workload)

    def measure(self, cfg, wl):  # type: ignore[no-untyped-def]
        self._enter("measuring", 0.03)
        return super().measure(cfg, wl)


@pytest.mark.parametrize("budget", [1, 9])
def test_parallel_trials_compile_ahead_measure_one_at_a_time_and_keep_the_budget(sessions, db_url, budget):
    fb = _ThreadedBackend()
    out = study(sessions, db_url, fb, n_trials=budget, parallel=4)
    assert out.stored
    st = optuna.load_study(study_name=out.key.study_name, storage=db_url)
    assert all(t.state.is_finished() for t in st.trials), "a trial was left running"
    measured = [t for t in st.trials if t.user_attrs.get("measured")]
    assert len(measured) == budget == len(fb.measured), "the budget was over- or under-spent"
    assert len({tuple(sorted(t.params.items())) for t in measured}) == budget, "a config was measured twice"
    assert fb.max_measuring == 1, "two measurements ran at once"
    assert budget == 1 or fb.max_compiling > 1, "no two compiles overlapped"
    assert fb.measured[0] == heuristic_config(H200, H=8, q_len=9, prefix=46000), "the default was not measured first"
    assert set(fb.measured) <= set(fb.compiled), "a config was measured without being compiled ahead"
    assert len(fb.compiled) == budget, "a compile went past the budget"
    unmeasured = [t for t in st.trials if t.state == optuna.trial.TrialState.FAIL]
    # nothing is asked past the budget; a config proposed while an earlier trial measures it fails
    assert all("measures the same config" in t.user_attrs.get("reason", "") for t in unmeasured)
    # a larger budget resumes the same study and measures only the difference
    more = _ThreadedBackend(seed=2)
    study(sessions, db_url, more, n_trials=budget + 3, parallel=4)
    assert len(more.measured) == 3


class _SlowDefaultBackend(_ThreadedBackend):
    """The default compiles slowest (a big config's nvcc): the others finish compiling first."""

    def compile_ahead(self, cfg, workload):  # type: ignore[no-untyped-def]
        slow = cfg == heuristic_config(H200, H=8, q_len=9, prefix=46000)
        self._enter("compiling", 0.6 if slow else 0.02)
        FakeBackend.compile_ahead(self, cfg, workload)


def test_the_default_is_measured_first_even_when_it_compiles_last(sessions, db_url):
    # the baseline every later trial is compared with: measured before anything submitted after it
    fb = _SlowDefaultBackend()
    out = study(sessions, db_url, fb, n_trials=6, parallel=4)
    assert out.stored and fb.max_compiling > 1
    assert fb.measured[0] == heuristic_config(H200, H=8, q_len=9, prefix=46000)
    assert fb.max_measuring == 1


def test_optuna_commits_trials_without_fsync_and_the_config_db_keeps_full(tmp_path):
    from sqlalchemy import text
    from verify_tuner.search.study_storage import open_storage
    from verify_tuner.store import migrate
    from verify_tuner.store.session import make_engine

    url = f"sqlite:///{tmp_path}/configs.db"
    migrate.upgrade(url)
    storage = open_storage(url)
    with storage.engine.connect() as c:  # Optuna's trials: NORMAL (1)
        assert c.execute(text("PRAGMA synchronous")).scalar() == 1
        assert c.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    with make_engine(url).connect() as c:  # best configs and claims: FULL (2)
        assert c.execute(text("PRAGMA synchronous")).scalar() == 2


def test_a_study_storage_of_its_own_is_in_wal_mode(tmp_path):
    """A study storage apart from the config database (TUNER_STUDY_STORAGE, a file per key) is
    created by Optuna's engine, which sets no journal mode: it must still be WAL, where readers
    (every process's sampler reads the trials) never block a writer. It was left in rollback-journal
    mode until session 8."""
    from sqlalchemy import text
    from verify_tuner.search.study_storage import open_storage

    storage = open_storage(f"sqlite:///{tmp_path}/studies.db")
    with storage.engine.connect() as c:
        assert c.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert c.execute(text("PRAGMA synchronous")).scalar() == 1


def test_a_search_over_candidates_without_the_default_does_not_refuse_its_warm_start(sessions, db_url):
    import random

    valid = space.valid_configs(H200, H=8, q_len=9)
    default = heuristic_config(H200, H=8, q_len=9, prefix=WL.prefix)
    listed = frozenset(c for c in random.Random(1).sample(valid, 60) if c != default)
    out = run_study(
        backend=FakeBackend(),
        sessions=sessions,
        options=StudyOptions(storage_url=db_url, seed=0, candidates=listed),
        workload=WL,
        n_trials=5,
    )
    st = optuna.load_study(study_name=out.key.study_name, storage=db_url)
    assert st.trials and all(KernelConfig.from_params(t.params) != default for t in st.trials if len(t.params) == 10)
    assert "not among the candidates" not in [t.user_attrs.get("reason") for t in st.trials[:1]]


def test_candidates_that_are_all_invalid_are_one_clear_error(sessions, db_url):
    too_big = KernelConfig(nsplit=132, ht=128, tk=128, block=1024, stages=8)
    with pytest.raises(InvalidConfig, match="none of the 1 candidates is valid"):
        run_study(
            backend=FakeBackend(),
            sessions=sessions,
            options=StudyOptions(storage_url=db_url, seed=0, candidates=frozenset({too_big})),
            workload=WL,
            n_trials=5,
        )


def test_a_search_over_candidates_measures_only_those(sessions, db_url):
    # a sampled sweep's replay (bench/tpe_efficiency.py) or an operator's short list: TPE's other
    # proposals are refused as trials of their own, and the nearest listed config is tried instead
    import random

    valid = space.valid_configs(H200, H=8, q_len=9)
    default = heuristic_config(H200, H=8, q_len=9, prefix=WL.prefix)
    listed = frozenset(random.Random(0).sample(valid, 60)) | {default}
    fb = FakeBackend()
    out = run_study(
        backend=fb,
        sessions=sessions,
        options=StudyOptions(storage_url=db_url, seed=0, candidates=listed),
        workload=WL,
        n_trials=20,
    )
    assert out.stored and out.best in listed
    assert len(set(fb.measured)) >= 20 and set(fb.measured) <= listed
    assert all(c in listed for batch in fb.remeasured for c in batch)
    st = optuna.load_study(study_name=out.key.study_name, storage=db_url)
    refused = [t.user_attrs.get("reason") for t in st.trials if t.user_attrs.get("state") == "invalid"]
    assert "not among the candidates" in refused


def test_a_study_storage_that_refuses_is_named_not_the_config_database(sessions, db_url):
    """`study start` with TUNER_STUDY_STORAGE pointing at a server that is down reported "database
    unavailable: ... (<the config database>)", which the operator had just migrated."""
    from verify_tuner.cli.exits import operator_message
    from verify_tuner.errors import StudyStorageError

    down = "postgresql+psycopg://nobody:secret@127.0.0.1:1/studies"  # nothing listens on port 1
    options = StudyOptions(storage_url=down, seed=1, heartbeat_s=None)
    with pytest.raises(StudyStorageError) as info:
        run_study(backend=FakeBackend(), sessions=sessions, options=options, workload=WL, n_trials=1)
    line = operator_message(info.value)
    assert line is not None and line.startswith("study storage unavailable: ") and "\n" not in line
    assert "127.0.0.1:1/studies" in line and "TUNER_STUDY_STORAGE" in line
    assert "secret" not in line and db_url not in line


@pytest.mark.parametrize(
    "statement, ours",
    [
        ("UPDATE trials SET state=? WHERE trials.trial_id = ?", False),  # Optuna's table: the study storage's
        ("INSERT INTO tuning_trials (study_id, params) VALUES (?, ?)", True),  # the config database's
    ],
    ids=["study-storage", "config-database"],
)
def test_a_database_failure_mid_study_is_blamed_on_the_database_it_hit(sessions, db_url, monkeypatch, statement, ours):
    """After the storage opened: a failed statement on Optuna's tables names the study storage; one
    on the config database's stays the config database's error (the CLI names that database)."""
    from sqlalchemy.exc import OperationalError
    from verify_tuner.errors import StudyStorageError

    def tell(self, *args, **kwargs):
        raise OperationalError(statement, {}, Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(optuna.study.Study, "tell", tell)
    expected = OperationalError if ours else StudyStorageError
    with pytest.raises(expected) as info:
        study(sessions, db_url, FakeBackend(), n_trials=2)
    if not ours:
        assert str(info.value).startswith("study storage unavailable: server closed the connection unexpectedly")


def test_a_study_timed_cold_is_its_own_study_and_its_row_says_how_it_was_timed(sessions, db_url):
    """A cold study (each launch followed by the neighbour GEMM) never resumes the key's back-to-back
    study, whose times do not compare with its own; the row stored last says how it was timed."""
    from dataclasses import replace as dc_replace

    cold_wl = dc_replace(WL, neighbour_mb=128)
    fb = FakeBackend(cost=lambda cfg, wl: fake_cost(cfg, wl) + (5.0 if wl.neighbour_mb else 0.0))
    warm = study(sessions, db_url, fb, n_trials=10)
    n_warm = len(fb.workloads)
    cold = study(sessions, db_url, fb, n_trials=10, workload=cold_wl)
    assert cold.key == warm.key and cold.study_id != warm.study_id
    with session_scope(sessions) as s:
        rows = {r.id: r for r in s.query(models.Study).all()}
        best = best_configs.get_best(session=s, key=cold.key)
    assert rows[warm.study_id].workload_key == str(warm.key) and rows[warm.study_id].neighbour_mb == 0
    assert rows[cold.study_id].workload_key == f"{cold.key}|N128" and rows[cold.study_id].neighbour_mb == 128
    assert len(trials(sessions, cold.study_id)) >= 10  # its own trials: none of the back-to-back study's
    assert {w.neighbour_mb for w in fb.workloads[n_warm:]} == {128}  # search and winner phase alike
    assert best.neighbour_mb == 128 and best.median_us > 5.0
    names = {s.study_name for s in optuna.get_all_study_summaries(storage=db_url)}
    assert {warm.key.study_name, warm.key.study_name_for(128)} <= names
    # back to back again: the first study resumes, and the row is its again
    again = study(sessions, db_url, fb, n_trials=12)
    assert again.study_id == warm.study_id
    with session_scope(sessions) as s:
        assert best_configs.get_best(session=s, key=again.key).neighbour_mb == 0


@pytest.mark.parametrize("mb", [-1, 4097, True, 1.5])
def test_a_workload_refuses_a_neighbour_size_out_of_range(mb):
    with pytest.raises(ValueError, match="neighbour_mb must be an integer 0..4096"):
        Workload(8, 9, 46000, neighbour_mb=mb)


def test_a_study_storage_that_accepts_and_never_answers_is_named_not_a_hang(sessions, pg_url):
    """TUNER_STUDY_STORAGE on a PostgreSQL behind a stalled path (a frozen host): Optuna's engine had
    no connect timeout, so `study start` waited for good where the config database gives up."""
    import threading
    import time

    from sqlalchemy.engine import make_url
    from verify_tuner.errors import StudyStorageError

    from tests.stall_proxy import stalling_proxy

    real = make_url(pg_url)
    with stalling_proxy((real.host or "127.0.0.1", real.port or 5432)) as proxy:
        proxy.stall()
        url = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        options = StudyOptions(storage_url=url, seed=1, heartbeat_s=None)
        raised: list[BaseException] = []

        def start() -> None:
            try:
                run_study(backend=FakeBackend(), sessions=sessions, options=options, workload=WL, n_trials=1)
            except BaseException as exc:  # noqa: BLE001 (the test reads it)
                raised.append(exc)

        t0 = time.monotonic()
        worker = threading.Thread(target=start, daemon=True)
        worker.start()
        worker.join(60)
        assert not worker.is_alive(), "study start still waiting on a storage that never answers"
    assert len(raised) == 1 and isinstance(raised[0], StudyStorageError), raised
    assert str(raised[0]).startswith("study storage unavailable: ") and time.monotonic() - t0 < 40


@pytest.mark.parametrize("storage_down", [True, False], ids=["storage-down", "storage-up"])
def test_a_failure_naming_no_statement_is_the_study_storages_only_if_it_no_longer_answers(
    sessions, pg_url, monkeypatch, storage_down
):
    """A connection lost at checkout names no statement: it was blamed on the config database
    whichever database went away. The storage (behind a proxy that is then shut) is probed."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError
    from verify_tuner.errors import StudyStorageError

    from tests.stall_proxy import stalling_proxy

    real = make_url(pg_url)
    with stalling_proxy((real.host or "127.0.0.1", real.port or 5432)) as proxy:
        url = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)

        def tell(self, *args, **kwargs):
            if storage_down:
                proxy.close()  # the storage's server is gone: new connections are refused
            raise OperationalError(None, None, Exception("server closed the connection unexpectedly"))

        monkeypatch.setattr(optuna.study.Study, "tell", tell)
        options = StudyOptions(storage_url=url, seed=1, heartbeat_s=None)
        expected = StudyStorageError if storage_down else OperationalError
        with pytest.raises(expected) as info:
            run_study(backend=FakeBackend(), sessions=sessions, options=options, workload=WL, n_trials=2)
    if storage_down:
        assert str(info.value).startswith("study storage unavailable: server closed the connection unexpectedly")
        assert f"127.0.0.1:{proxy.port}" in str(info.value)


def test_a_stopping_process_withdraws_only_the_trials_it_queued_and_nobody_took(tmp_path):
    """Processes sharing a study can take each other's queued trial (an ask takes the oldest it
    sees); the one queued last was then left waiting after every process stopped."""
    from verify_tuner.keys import ConfigKey
    from verify_tuner.search.key_search import REASON_ATTR, KeySearch
    from verify_tuner.search.ledger import Ledger
    from verify_tuner.search.proposer import Proposer
    from verify_tuner.search.study_storage import open_storage

    storage = open_storage(f"sqlite:///{tmp_path / 'studies.db'}")
    st = optuna.create_study(study_name="shared", storage=storage)
    valid = space.valid_configs(H200, H=8, q_len=9, restrict=FIXED)
    key = ConfigKey(H200.name, "k", "bf16", 8, 9, 46000)
    search = KeySearch(key, WL, 0, space.choices(8, FIXED, H200, q_len=9), valid, budget=5, parallel=1)

    def process(i: int) -> Proposer:
        kw = {"log": None, "reject": lambda p: None, "n_startup": 0, "grid": False, "seed": i}
        return Proposer(study=st, storage=storage, search=search, ledger=Ledger(st), warm=[valid[i].as_params()], **kw)

    a, b = process(0), process(1)  # both read the study before either queued: both queue
    a._feed()
    b._feed()
    taken = st.ask(search.space)  # b's ask takes the oldest queued trial, a's
    assert taken.params == valid[0].as_params()
    st.tell(taken, 1.0)
    st.enqueue_trial(valid[2].as_params())  # queued by no proposer (as Optuna's retry of a stale trial)
    assert a.withdraw() == 0  # a's ask saw nothing left (b's was not yet committed) and stopped
    assert b.withdraw() == 1
    left = {t.number: t for t in st.get_trials()}
    assert left[1].state == optuna.trial.TrialState.FAIL
    assert left[1].user_attrs[REASON_ATTR] == "not measured: queued when its process stopped"
    assert left[2].state == optuna.trial.TrialState.WAITING  # another's queue entry stays for a resume


def test_a_study_of_an_e4m3_cache_stores_its_winner_under_that_format_only(sessions, db_url):
    """`tuner study start --kv-dtype fp8_e4m3`: the key carries the format, so the winner is stored
    for e4m3 caches and a bf16 lookup of the same shape stays the heuristic's."""
    from dataclasses import replace

    from verify_tuner.store import lookup

    out = study(sessions, db_url, FakeBackend(), workload=Workload(8, 9, 46000, kv_dtype="fp8_e4m3"), n_trials=6)
    assert out.stored and out.key.kv_dtype == "fp8_e4m3"
    with session_scope(sessions) as s:
        assert best_configs.get_best(session=s, key=out.key).config == out.best
        assert best_configs.get_best(session=s, key=replace(out.key, kv_dtype="bf16")) is None
        e4m3 = lookup.local_key(H200, H=8, q_len=9, kv_dtype="fp8_e4m3")
        assert lookup.answer(session=s, limits=H200, key=e4m3, prefix=46000).source == "tuned"
        bf16 = lookup.local_key(H200, H=8, q_len=9, kv_dtype="bf16")
        assert lookup.answer(session=s, limits=H200, key=bf16, prefix=46000).source == "heuristic"


def test_a_trial_failed_as_stale_while_it_was_measured_is_dropped_not_a_crash(tmp_path, caplog):
    """A tuner process suspended past the heartbeat's grace resumes to find the trial it was measuring
    failed (by another process's heartbeat check, or its own on resuming) and its config queued again.
    Its tell then raised UpdateFinishedTrialError and stopped the job: now that trial is dropped with
    a warning, the search goes on and stores its winner. A trial finished as a second tell of our own
    would leave it still stops the job (the error is not swallowed)."""
    import logging

    from verify_tuner.store import migrate
    from verify_tuner.store.session import make_engine, session_factory

    def run(name: str, finish_as: optuna.trial.TrialState):  # type: ignore[no-untyped-def]
        url = f"sqlite:///{tmp_path / name}"
        migrate.upgrade(url)

        class Suspended(FakeBackend):
            def measure(self, cfg, wl):  # type: ignore[no-untyped-def]
                m = super().measure(cfg, wl)
                if len(self.measured) == 3:  # the trials running in this process, finished under it
                    (summary,) = optuna.get_all_study_summaries(storage=url)
                    st = optuna.load_study(study_name=summary.study_name, storage=url)
                    for t in st.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                        values = [1.0] if finish_as == optuna.trial.TrialState.COMPLETE else None
                        st._storage.set_trial_state_values(t._trial_id, state=finish_as, values=values)
                return m

        return url, study(session_factory(make_engine(url)), url, Suspended(), n_trials=12)

    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        run("told-twice.db", optuna.trial.TrialState.COMPLETE)
    with caplog.at_level(logging.WARNING, logger="verify_tuner.search.loop"):
        url, out = run("suspended.db", optuna.trial.TrialState.FAIL)
    assert out.stored and out.best is not None
    assert "was failed as stale while it was measured" in caplog.text
    (summary,) = optuna.get_all_study_summaries(storage=url)
    st = optuna.load_study(study_name=summary.study_name, storage=url)
    failed = [t for t in st.trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed and not any(t.user_attrs.get("measured") for t in failed)
    assert all(t.state.is_finished() for t in st.trials)
