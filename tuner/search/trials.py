"""One key's search loop on Optuna's ask/tell, in the shape its authors describe: one proposer
asks the study's sampler and checks each config before anything is built (a config `validate`
refuses is told to Optuna as a pruned trial with its reason, so TPE learns where the device's
limits are), a pool of threads compiles what it accepts (nvcc is single-threaded), and one thread
measures, one config at a time, while the loop tells each result back. Only the loop's thread
talks to the study. Several processes share one study through its RDB storage: the loop beats
its trials in flight with the storage's heartbeat, so a killed process's trials are failed and
queued again (RetryHeartbeatStaleTrialCallback) for whoever asks next.
"""

from __future__ import annotations

import functools
import random
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Self

import numpy as np
import optuna
from optuna.trial import TrialState
from sqlalchemy.orm import Session, sessionmaker
from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.kernels.validate import check
from verify_tuner.keys import ConfigKey
from verify_tuner.measure.backend import INVALID, Backend, Measurement, Workload
from verify_tuner.store import repo
from verify_tuner.store.session import session_scope

PARAMS = PARAM_NAMES
MEASURED_ATTR, STATE_ATTR, REASON_ATTR, REUSED_ATTR = "measured", "state", "reason", "reused_trial"
#: How long an earlier trial of another process may still be writing its params (it is being
#: asked) before the proposer stops waiting to see whether it holds the same config.
ASKING_S = 2.0

Signature = tuple[int, ...]


def signature(params: dict[str, int]) -> Signature:
    return tuple(params[p] for p in PARAMS)


def config_signature(cfg: KernelConfig) -> Signature:
    return tuple(getattr(cfg, p.lower()) for p in PARAMS)


def refusal(params: dict[str, int], limits: DeviceLimits, key: ConfigKey) -> str | None:
    """Why verify_tuner.kernels.validate refuses these params for `key` on this device, or None."""
    return check(KernelConfig.from_params(params), limits, H=key.H, q_len=key.q_len)


@dataclass(frozen=True)
class Progress:
    key: ConfigKey
    measured: int
    budget: int
    best_us: float | None
    default_us: float | None
    last: str


@dataclass(frozen=True)
class KeySearch:
    """What the loop searches: one key's space, the configs that fit it, and its limits."""

    key: ConfigKey
    workload: Workload
    study_id: int  # the config database's row, which the trial log writes to
    choices: dict[str, list[int]]
    valid: Sequence[KernelConfig]
    budget: int  # measurements, by every process sharing the study
    parallel: int  # this process's trials in flight: compiling, waiting for the GPU or measuring
    timeout_s: float | None = None
    default: KernelConfig | None = None

    @property
    def space(self) -> dict[str, optuna.distributions.CategoricalDistribution]:
        return {k: optuna.distributions.CategoricalDistribution(v) for k, v in self.choices.items()}

    @property
    def max_trials(self) -> int:
        """Trials of every kind after which the search gives up (a sampler that only repeats)."""
        return 20 * self.budget + len(self.valid)


class TrialLog:
    """The config database's row of each trial. An invalid config's row waits for the next
    measurement's transaction (or `flush`): refused proposals are most of a key's trials, and a
    commit each held the write lock of an SQLite file that the job's other processes wait on. A
    killed process loses only waiting rows (the study has every refusal as a pruned trial)."""

    def __init__(self, sessions: sessionmaker[Session], study_id: int) -> None:
        self.sessions, self.study_id = sessions, study_id
        self.waiting: list[tuple[dict[str, int], Measurement]] = []

    def record(self, params: dict[str, int], m: Measurement) -> None:
        self.waiting.append((params, m))
        if m.state != INVALID:
            self.flush()

    def flush(self) -> None:
        rows, self.waiting = self.waiting, []
        if not rows:
            return
        with session_scope(self.sessions) as s:
            for params, m in rows:
                repo.record_trial(
                    session=s,
                    study_id=self.study_id,
                    params=params,
                    state=m.state,
                    reason=m.reason,
                    median_us=m.median_us,
                    p10_us=m.p10_us,
                    p90_us=m.p90_us,
                    samples=m.samples or None,
                    rel_error=m.rel_error,
                )


class Ledger:
    """What the study holds, in every process sharing it, as of the last `read`."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study
        self.read()

    def read(self) -> None:
        trials = self.study.get_trials(deepcopy=False)
        self.known: dict[Signature, optuna.trial.FrozenTrial] = {}  # measured, first trial of each config
        self.running: list[optuna.trial.FrozenTrial] = []
        self.measured = self.modelled = self.waiting = 0  # modelled: what TPE learns from
        for t in trials:
            if t.state == TrialState.RUNNING:
                self.running.append(t)
            elif t.state == TrialState.WAITING:
                self.waiting += 1
            elif t.user_attrs.get(MEASURED_ATTR):
                self.measured += 1
                self.known.setdefault(signature(t.params), t)
            self.modelled += t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        self.total = len(trials)

    def twin(self, number: int, sig: Signature) -> int | None:
        """An earlier running trial of this config (this process's or another's), or None."""
        return next(
            (
                t.number
                for t in self.running
                if t.number < number and len(t.params) == len(PARAMS) and signature(t.params) == sig
            ),
            None,
        )

    def asking(self, number: int) -> bool:
        """An earlier trial is still being asked: its params, maybe this config, are not all written."""
        now = time.time()
        return any(
            t.number < number
            and len(t.params) < len(PARAMS)
            and t.datetime_start is not None
            and now - t.datetime_start.timestamp() < ASKING_S
            for t in self.running
        )


class Heartbeat:
    """Beats this process's trials in flight through the storage's heartbeat (Optuna's optimize
    does this for the trial its objective runs; ask/tell leaves it to the caller), and fails
    other processes' stale trials (fail_stale_trials, whose retry callback queues them again)."""

    def __init__(self, study: optuna.Study, storage: optuna.storages.BaseStorage) -> None:
        self.study, self.storage = study, storage
        interval = storage.get_heartbeat_interval() if isinstance(storage, optuna.storages.RDBStorage) else None
        self.interval = float(interval) if interval else None
        self.study_id = storage.get_study_id_from_name(study.study_name) if self.interval else None
        self.ids: dict[int, int] = {}  # trial number -> trial id
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.checked = float("-inf")
        self.thread = threading.Thread(target=self._beat, name="trial-heartbeat", daemon=True)

    def __enter__(self) -> Self:
        if self.interval:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()

    def add(self, number: int) -> None:
        if self.study_id is None:
            return
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        self.storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
        with self.lock:
            self.ids[number] = trial_id

    def drop(self, number: int) -> None:
        with self.lock:
            self.ids.pop(number, None)

    def fail_stale(self) -> None:
        """Fail trials whose process stopped beating, at most once an interval."""
        if self.interval is None or time.monotonic() - self.checked < self.interval:
            return
        self.checked = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)

    def _beat(self) -> None:
        assert self.interval is not None
        while not self.stop.wait(self.interval):
            with self.lock:
                ids = list(self.ids.values())
            for trial_id in ids:
                self.storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]


class Pipeline:
    """Compiles configs in a pool of threads and measures them one at a time in another: the GPU
    is never shared, and a config compiles while the one before it measures."""

    def __init__(self, backend: Backend, workload: Workload, compile_jobs: int) -> None:
        self.backend, self.workload = backend, workload
        self.compiling = ThreadPoolExecutor(max(1, compile_jobs), thread_name_prefix="compile")
        self.gpu = ThreadPoolExecutor(1, thread_name_prefix="measure")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.compiling.shutdown(wait=exc[0] is None, cancel_futures=True)
        self.gpu.shutdown(wait=exc[0] is None, cancel_futures=True)

    def submit(self, cfg: KernelConfig) -> Future[Measurement]:
        return self.compiling.submit(self._build_then_measure, cfg)

    def _build_then_measure(self, cfg: KernelConfig) -> Measurement:
        self.backend.compile_ahead(cfg, self.workload.q_len)
        return self.gpu.submit(self.backend.measure, cfg, self.workload).result()


@functools.lru_cache(maxsize=8)
def _values(valid: tuple[KernelConfig, ...]) -> np.ndarray:
    """The constants of every config, one row each (cached: a table's keys share their space)."""
    return np.array([config_signature(c) for c in valid], dtype=np.int64).reshape(len(valid), len(PARAMS))


class Neighbours:
    """The configs that fit, as positions in their constants' choices, to find the one nearest
    a refused proposal (fewest steps along the choices). Built on the first refusal."""

    def __init__(self, valid: Sequence[KernelConfig], choices: dict[str, list[int]], seed: int | None) -> None:
        self.valid, self.choices, self.rng = valid, choices, np.random.default_rng(seed)
        self.grid: np.ndarray | None = None

    def _positions(self, values: np.ndarray) -> np.ndarray:
        """Each value's position in its constant's choices (a value outside them: position 0)."""
        out = np.zeros(values.shape, dtype=np.int64)
        for j, p in enumerate(PARAMS):
            for i, v in enumerate(self.choices[p]):
                out[..., j][values[..., j] == v] = i
        return out

    def nearest(self, params: dict[str, int], skip: set[Signature]) -> KernelConfig | None:
        """The nearest config that fits and is not in `skip`; ties broken at random."""
        if not self.valid:
            return None
        if self.grid is None:
            self.grid = self._positions(_values(tuple(self.valid)))
        row = self._positions(np.array([params[p] for p in PARAMS], dtype=np.int64))
        steps = np.abs(self.grid - row).sum(axis=1) + self.rng.random(len(self.valid)) * 0.5
        return next((self.valid[i] for i in np.argsort(steps) if config_signature(self.valid[i]) not in skip), None)


@dataclass(frozen=True)
class Proposal:
    trial: optuna.Trial
    params: dict[str, int]

    @property
    def cfg(self) -> KernelConfig:
        return KernelConfig.from_params(self.params)


class Proposer:
    """Asks the study for configs and answers at once those that need no measurement: refused
    (pruned, with the reason), measured before by any process (the same value or pruned again),
    or in flight in an earlier trial (failed: TPE ignores it; the config is measured once).

    Configs the proposer chooses itself are queued with enqueue_trial just before the ask that
    takes them: the warm start, then -- while TPE has too few trials to model (its start) -- a
    config drawn among those that fit (TPE's own start draws from the whole space, where most
    configs do not fit), or, for a grid, the next config that fits."""

    def __init__(
        self,
        *,
        study: optuna.Study,
        search: KeySearch,
        ledger: Ledger,
        log: TrialLog,
        reject: Callable[[dict[str, int]], str | None],
        warm: list[dict[str, int]],
        n_startup: int,
        grid: bool,
        seed: int | None,
    ) -> None:
        self.study, self.search, self.ledger, self.log, self.reject = study, search, ledger, log, reject
        self.warm, self.n_startup, self.rng = list(warm), n_startup, random.Random(seed)
        self.grid: Iterator[KernelConfig] | None = self._grid_order() if grid else None
        self.exhausted = False  # a grid with nothing left to propose
        self.neighbours = Neighbours(search.valid, search.choices, seed)
        self.repaired: KernelConfig | None = None  # the config nearest the last refused one

    def ask(self) -> Proposal | None:
        """One ask: a config to measure, or None when this one was answered without measuring."""
        self._feed()
        if self.exhausted:
            return None
        with warnings.catch_warnings():  # Optuna expects its heartbeat under optimize; the loop beats it
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            trial = self.study.ask(self.search.space)
        self.ledger.total += 1
        self.ledger.waiting = max(0, self.ledger.waiting - 1)
        params = {p: int(trial.params[p]) for p in PARAMS}
        reason = self.reject(params)
        if reason is not None:  # never compiled, never run, not counted against the budget
            self._refuse(trial, params, reason)
            return None
        return self._unless_known(Proposal(trial, params))

    def _feed(self) -> None:
        if self.ledger.waiting:
            return
        if self.repaired is not None:
            self.study.enqueue_trial(self.repaired.as_params())
            self.repaired = None
        elif self.warm:
            self.study.enqueue_trial(self.warm.pop(0))
        elif self.grid is not None:
            cfg = next((c for c in self.grid if config_signature(c) not in self.ledger.known), None)
            if cfg is None:
                self.exhausted = True
                return
            self.study.enqueue_trial(cfg.as_params())
        elif self.ledger.modelled < self.n_startup and self.search.valid:
            self.study.enqueue_trial(self.rng.choice(self.search.valid).as_params())
        else:
            return
        self.ledger.waiting += 1

    def _grid_order(self) -> Iterator[KernelConfig]:
        order = list(self.search.valid)
        self.rng.shuffle(order)  # processes sharing a grid study start apart
        return iter(order)

    def _refuse(self, trial: optuna.Trial, params: dict[str, int], reason: str) -> None:
        trial.set_user_attr(STATE_ATTR, INVALID)
        trial.set_user_attr(REASON_ATTR, reason[:500])
        self.study.tell(trial, state=TrialState.PRUNED)
        self.ledger.modelled += 1
        self.log.record(params, Measurement(INVALID, reason=reason))
        if self.grid is None:
            skip = set(self.ledger.known) | {
                signature(t.params) for t in self.ledger.running if len(t.params) == len(PARAMS)
            }
            self.repaired = self.neighbours.nearest(params, skip)

    def _unless_known(self, p: Proposal) -> Proposal | None:
        """`p`, unless its config was measured or is in flight (read now: another process may
        have measured it since the last read)."""
        sig, number = signature(p.params), p.trial.number
        self.ledger.read()
        deadline = time.monotonic() + ASKING_S
        while self.ledger.asking(number) and sig not in self.ledger.known and time.monotonic() < deadline:
            time.sleep(0.02)
            self.ledger.read()
        prev = self.ledger.known.get(sig)
        if prev is not None:
            self._reuse(p.trial, prev)
            return None
        twin = self.ledger.twin(number, sig)
        if twin is not None:
            p.trial.set_user_attr(REASON_ATTR, f"not measured: trial {twin} measures the same config")
            self.study.tell(p.trial, state=TrialState.FAIL)
            return None
        return p

    def _reuse(self, trial: optuna.Trial, prev: optuna.trial.FrozenTrial) -> None:
        """Answer from the stored measurement: a failed one is pruned again, as the first one was
        (TPE ranks it among the worst and steers away)."""
        trial.set_user_attr(REUSED_ATTR, prev.number)
        for k in (STATE_ATTR, REASON_ATTR):
            if k in prev.user_attrs:
                trial.set_user_attr(k, prev.user_attrs[k])
        if prev.value is None:
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, prev.value)
        self.ledger.modelled += 1


class Loop:
    """Keeps up to `parallel` proposals in the pipeline, within the budget, and tells each
    measurement back as it comes."""

    def __init__(
        self,
        *,
        study: optuna.Study,
        search: KeySearch,
        proposer: Proposer,
        pipeline: Pipeline,
        heartbeat: Heartbeat,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.study, self.search, self.proposer = study, search, proposer
        self.pipeline, self.heartbeat, self.on_progress = pipeline, heartbeat, on_progress
        self.ledger, self.log = proposer.ledger, proposer.log
        self.in_flight: dict[Future[Measurement], Proposal] = {}
        self.best_us: float | None = None
        self.default_us: float | None = None
        self.deadline = time.monotonic() + search.timeout_s if search.timeout_s else float("inf")

    def run(self) -> None:
        try:
            while True:
                self.ledger.read()
                self._fill()
                if not self.in_flight:
                    return
                done, _ = wait(self.in_flight, return_when=FIRST_COMPLETED)
                for f in done:
                    p = self.in_flight.pop(f)
                    self.heartbeat.drop(p.trial.number)
                    self._told(p, self._result(p, f))
        except BaseException:
            for p in self.in_flight.values():  # a bug, or interrupted: nothing waits for these
                self.study.tell(p.trial, state=TrialState.FAIL, skip_if_finished=True)
            raise
        finally:
            self.log.flush()

    def _room(self) -> bool:
        s, n = self.search, len(self.in_flight)
        return (
            n < s.parallel
            and self.ledger.measured + n < s.budget  # this process's count: others' flights are theirs
            and len(self.ledger.known) + n < len(s.valid)
            and self.ledger.total < s.max_trials
            and time.monotonic() < self.deadline
            and not self.proposer.exhausted
        )

    def _fill(self) -> None:
        while self._room():
            self.heartbeat.fail_stale()
            p = self.proposer.ask()
            if p is not None:
                self.heartbeat.add(p.trial.number)
                self.in_flight[self.pipeline.submit(p.cfg)] = p

    def _result(self, p: Proposal, f: Future[Measurement]) -> Measurement:
        try:
            return f.result()
        except BaseException:
            self.study.tell(p.trial, state=TrialState.FAIL)
            raise

    def _told(self, p: Proposal, m: Measurement) -> None:
        """Store a measurement: its row in the config database, its trial's attributes and state."""
        self.log.record(p.params, m)
        p.trial.set_user_attr(MEASURED_ATTR, True)
        p.trial.set_user_attr(STATE_ATTR, m.state)
        if m.reason:
            p.trial.set_user_attr(REASON_ATTR, m.reason[:500])
        if m.ok:  # the spread (p10/p90) is in the config database's row
            self.study.tell(p.trial, m.median_us)
            if p.cfg == self.search.default:
                self.default_us = m.median_us
            if self.best_us is None or m.median_us < self.best_us:  # type: ignore[operator]
                self.best_us = m.median_us
        else:  # pruned, not failed: TPE ranks it among the worst, where a failed one is invisible
            self.study.tell(p.trial, state=TrialState.PRUNED)  # to it and proposed again and again
        self.ledger.measured += 1
        if self.on_progress:
            s = self.search
            last = f"{p.params} -> {m.state}"
            self.on_progress(Progress(s.key, self.ledger.measured, s.budget, self.best_us, self.default_us, last))
