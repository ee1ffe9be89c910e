"""One key's search, as Optuna drives it: the objective (one config: check, reuse, compile,
measure), the ledger of what the study has measured, and the sampler wrapper that proposes the
warm-start configs first. Several trials may be in flight in threads (verify_tuner.search.study.run_study's
`parallel`): their coordination -- one proposer at a time, places in the budget, one measurement
at a time, twins -- lives here.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import optuna
from sqlalchemy.orm import Session, sessionmaker
from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.kernels.validate import check
from verify_tuner.keys import ConfigKey
from verify_tuner.measure.backend import INVALID, Backend, Measurement, Workload
from verify_tuner.search.outcome import Outcome
from verify_tuner.store import repo
from verify_tuner.store.session import session_scope

PARAMS = PARAM_NAMES
MEASURED_ATTR, STATE_ATTR, REASON_ATTR = "measured", "state", "reason"
#: How long a trial waits for another process's running trial of the same config before measuring
#: it itself (a dead process's trial is failed by the heartbeat well within this).
TWIN_WAIT_S = 300.0


@dataclass
class Progress:
    key: ConfigKey
    measured: int
    budget: int
    best_us: float | None
    default_us: float | None
    last: str


class _HeldWrites:
    """A storage whose set_trial_system_attr calls are held, not written; everything else goes to
    `storage`. TPE with the constant liar writes each relative proposal to the asking trial (so
    other processes see what a running trial is about to suggest); WarmFirst lets through only
    the proposal it accepts, where every refused redraw would have been one more write."""

    def __init__(self, storage: object) -> None:
        self._storage = storage
        self.held: list[tuple[object, ...]] = []

    def set_trial_system_attr(self, *args: object) -> None:
        self.held.append(args)

    def __getattr__(self, name: str) -> object:
        return getattr(self._storage, name)


class _QuietStudy:
    """The study as the inner sampler sees it during redraws: the same object in every respect
    (its methods are the real study's, bound to the real storage) except `_storage`, whose
    system-attribute writes are held (_HeldWrites)."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study
        self._storage = _HeldWrites(study._storage)

    def __getattr__(self, name: str) -> object:
        return getattr(self._study, name)


def refusal(params: dict[str, int], limits: DeviceLimits, key: ConfigKey) -> str | None:
    """Why verify_tuner.kernels.validate refuses these params for `key` on this device, or None."""
    return check(KernelConfig.from_params(params), limits, H=key.H, q_len=key.q_len)


class FitTPE(optuna.samplers.TPESampler):
    """Optuna's TPE whose proposal is the best of its candidates that `fits` (verify_tuner.kernels.validate
    accepts), not the best of all of them.

    TPE draws n_ei_candidates (24) configs from its model of the good trials and proposes the one
    with the highest acquisition (the good model's density over the bad one's). Most of the space
    does not fit the device, so the best candidate often did not either, and each refusal is a
    stored pruned trial and another draw: most of a key's search time. Here candidates that do not
    fit get no acquisition, so a candidate that fits is proposed whenever one was drawn, as TPE
    would have ranked it. When none of the 24 fits, TPE's own choice stands (refused and pruned by
    WarmFirst, which TPE then learns from).

    The hook is Optuna's TPESampler._compute_acquisition_func (a method, not public API; present
    from Optuna 3 to 5): the constructor fails loudly if it is gone, and a test checks the
    proposals fit."""

    def __init__(
        self, *, choices: dict[str, list[int]], fits: Callable[[dict[str, int]], bool], **kwargs: object
    ) -> None:
        if not callable(getattr(optuna.samplers.TPESampler, "_compute_acquisition_func", None)):
            raise RuntimeError(  # noqa: TRY004 -- the installed Optuna lacks the hook; no argument is wrong
                f"optuna {optuna.__version__}: TPESampler has no _compute_acquisition_func; "
                "verify_tuner.search.trials.FitTPE needs it to rank only the candidates that fit"
            )
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.choices, self.fits = choices, fits

    def _compute_acquisition_func(
        self, samples: dict[str, np.ndarray], mpe_below: object, mpe_above: object
    ) -> np.ndarray:
        acq = super()._compute_acquisition_func(samples, mpe_below, mpe_above)  # type: ignore[arg-type]
        fixed = {name: v[0] for name, v in self.choices.items() if name not in samples and len(v) == 1}
        if set(samples) | set(fixed) != set(self.choices):  # TPE leaves single-valued constants out of its
            return acq  # model; any other partial space (one constant at a time) is ranked as TPE ranks it
        ok = np.array(
            [
                self.fits(
                    {
                        name: fixed[name] if name in fixed else self.choices[name][int(samples[name][i])]
                        for name in self.choices
                    }
                )  # categorical candidates: indices into the choices
                for i in range(len(acq))
            ],
            dtype=bool,
        )
        if not ok.any():
            return acq
        return np.where(ok, acq, -np.inf)


class WarmFirst(optuna.samplers.BaseSampler):
    """Proposes the warm-start configs first, in order, then the inner sampler's proposals --
    checked before a trial takes them: one `reject` refuses is stored as a finished, pruned trial of
    its own (one storage write, where a trial that suggests it costs one per constant plus its
    state; with FitTPE only when none of TPE's candidates fit) and the inner sampler proposes again,
    having seen it, as it would have after the pruned trial (`refused` keeps the books:
    Search.refused). While the inner sampler has too few trials to model them (its random start),
    the proposal is drawn from `valid` (every config that fits), uniformly -- what redrawing uniform
    proposals until one fits gives, without the refused trials that redrawing stores (most of the
    space does not fit).

    Optuna's enqueue_trial keeps its queue in the storage, and a queued trial goes to whoever
    marks it running first: PostgreSQL locks the row, SQLite does not, and two threads (or two
    processes on one SQLite file) asking at once both took the same queued trial (seen with
    parallel trials: one measured it, the other then failed telling it). This queue lives in the
    process, and a config is handed out when a trial first suggests (one trial at a time, in
    the order they were asked: Search), so each goes to exactly one trial."""

    #: Proposals refused for one trial before the next is let through to the trial (and pruned there).
    REDRAWS = 256

    def __init__(
        self,
        inner: optuna.samplers.BaseSampler,
        warm: list[dict[str, int]],
        choices: dict[str, list[int]],
        reject: Callable[[dict[str, int]], str | None] | None = None,
        refused: Callable[[dict[str, int], str], None] | None = None,
        valid: Sequence[KernelConfig] = (),
        seed: int | None = None,
    ) -> None:
        self.inner, self.warm = inner, list(warm)
        self.space = {k: optuna.distributions.CategoricalDistribution(v) for k, v in choices.items()}
        self.handed: dict[int, dict[str, int]] = {}  # trial number -> its warm config
        self.reject, self.refused = reject, refused
        self.valid, self.rng = valid, random.Random(seed)
        self.lock = threading.Lock()

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict:
        with self.lock:
            if trial.number not in self.handed and self.warm:
                self.handed[trial.number] = self.warm.pop(0)
            if trial.number in self.handed or self.reject is not None:
                return dict(self.space)
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, search_space: dict) -> dict:
        with self.lock:
            params = self.handed.pop(trial.number, None)
        if params is not None:
            return dict(params)
        if self.reject is None:
            return self.inner.sample_relative(study, trial, search_space)
        proposal: dict = {}
        inner_space = self.inner.infer_relative_search_space(study, trial)  # every trial has the same space
        quiet = _QuietStudy(study)
        for _ in range(self.REDRAWS):
            quiet._storage.held.clear()
            proposal = dict(self.inner.sample_relative(quiet, trial, inner_space)) if inner_space else {}  # type: ignore[arg-type]
            if not proposal and self.valid:  # the inner sampler's random start: one of the configs that fit,
                return self.valid[self.rng.randrange(len(self.valid))].as_params()  # as its redraws would find
            for name, dist in self.space.items():  # what the inner sampler draws one by one, in order
                if name not in proposal:
                    proposal[name] = self.inner.sample_independent(study, trial, name, dist)
            reason = self.reject(proposal)
            if reason is None:
                for args in quiet._storage.held:  # the accepted proposal is shared as the sampler shares it
                    study._storage.set_trial_system_attr(*args)
                return proposal
            study.add_trial(
                optuna.trial.create_trial(
                    state=optuna.trial.TrialState.PRUNED,
                    params=proposal,
                    distributions=self.space,
                    user_attrs={STATE_ATTR: INVALID, REASON_ATTR: reason[:500]},
                )
            )
            if self.refused is not None:
                self.refused(proposal, reason)
        return proposal

    def sample_independent(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        param_name: str,
        param_distribution: optuna.distributions.BaseDistribution,
    ) -> object:
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, state: optuna.trial.TrialState, values: object
    ) -> None:
        self.inner.after_trial(study, trial, state, values)  # type: ignore[arg-type]


class BudgetSpent(Exception):
    """A trial asked while the key's last budgeted measurements were in flight: not measured
    (Optuna marks it failed, which its samplers ignore)."""


class Ledger:
    """Which parameter sets this study has measured (in any process sharing the storage).

    Reading every trial back from storage costs O(trials) per call, so the ledger re-reads it
    every REFRESH trials and tracks its own process's trials in between. Measured trials are
    counted by number, so a trial seen both by a refresh and by its own callback counts once."""

    REFRESH = 10

    def __init__(self, study: optuna.Study) -> None:
        self.study = study
        self.since = 0
        self.known: dict[tuple[int, ...], optuna.trial.FrozenTrial] = {}
        self.measured_ids: set[int] = set()
        self.total = 0
        self.refresh()

    @property
    def measured(self) -> int:
        return len(self.measured_ids)

    def refresh(self) -> None:
        trials = self.study.get_trials(deepcopy=False)
        self.known = {}
        for t in trials:
            if t.user_attrs.get(MEASURED_ATTR) and t.state.is_finished():
                self.known.setdefault(tuple(t.params[p] for p in PARAMS), t)
        self.measured_ids = {t.number for t in trials if t.user_attrs.get(MEASURED_ATTR)}
        self.total = len(trials)
        self.since = 0

    def after_trial(self, ft: optuna.trial.FrozenTrial) -> None:
        self.since += 1
        self.total += 1
        if ft.user_attrs.get(MEASURED_ATTR):
            self.measured_ids.add(ft.number)
            self.known.setdefault(tuple(ft.params[p] for p in PARAMS), ft)
        if self.since >= self.REFRESH:
            self.refresh()


class Search:
    """One key's search: the objective Optuna calls, the callback that stops it, and the state
    they share (the ledger of measured configs, the best and default times for progress).

    Optuna may run the objective in several threads (`run_study(parallel=N)`): each trial then
    compiles its config in its own thread (nvcc is single-threaded; a GPU host has cores to
    spare) while one trial at a time holds the GPU. One trial at a time proposes -- suggests its
    config, checks it, looks for a measurement to reuse, takes a place in the budget -- in the
    order the trials were asked (the warm-start configs first), and only while a place is free:
    proposals are as informed as one thread's (an invalid config costs one proposal, not a
    thread spinning through many), and nothing is compiled or measured past the budget. A trial
    left without a place once the trials in flight fill the budget is failed unmeasured
    (BudgetSpent). Twins (the same config proposed twice) are resolved in this process by
    whoever registered first, across processes by trial number through the storage."""

    def __init__(
        self,
        *,
        backend: Backend,
        sessions: sessionmaker[Session],
        workload: Workload,
        out: Outcome,
        study: optuna.Study,
        choices: dict[str, list[int]],
        n_valid: int,
        budget: int,
        on_progress: Callable[[Progress], None] | None,
    ) -> None:
        self.backend, self.sessions, self.workload, self.out = backend, sessions, workload, out
        self.choices, self.n_valid, self.budget, self.on_progress = choices, n_valid, budget, on_progress
        self.ledger = Ledger(study)
        self.best_us: float | None = None
        self.default_us: float | None = None
        self.state = threading.Condition()  # guards everything below and the ledger
        self.gpu = threading.Lock()  # one measurement at a time
        self.mine: set[int] = set()  # this process's trials in the objective
        self.waiting: set[int] = set()  # ... waiting to propose
        self.proposer: int | None = None  # ... proposing now
        self.reserved: set[int] = set()  # ... holding a place, not yet counted by the ledger
        self.own: dict[tuple[int, ...], int] = {}  # config -> this process's trial measuring it
        self.log_lock = threading.Lock()
        self.unlogged: list[tuple[dict[str, int], Measurement]] = []  # invalid configs' rows (record)

    @property
    def done(self) -> bool:
        return self.ledger.measured >= self.budget or len(self.ledger.known) >= self.n_valid

    def _spent(self) -> bool:
        """Every place is measured or held by a trial in flight (called with `state` held); raises
        BudgetSpent when they are all measured."""
        if len(self.ledger.measured_ids | self.reserved) < self.budget:
            return False
        if not self.reserved - self.ledger.measured_ids:
            raise BudgetSpent(
                f"not measured: the budget of {self.budget} measurements was spent by the trials "
                "in flight when it was asked"
            )
        return True

    def _reserve(self, number: int) -> None:
        """Take a place for trial `number` (the proposer, or a trial back from waiting on a twin
        that failed), waiting while the trials in flight hold every place."""
        with self.state:
            while self._spent():
                self.state.wait()
            self.reserved.add(number)
            self._done_proposing(number)

    def _done_proposing(self, number: int) -> None:
        """The next asked trial may propose (called with `state` held)."""
        if self.proposer == number:
            self.proposer = None
        self.state.notify_all()

    def refusal(self, params: dict[str, int]) -> str | None:
        """Why `validate` refuses these params for this key, or None."""
        return refusal(params, self.backend.limits, self.out.key)

    def refused(self, params: dict[str, int], reason: str) -> None:
        """The sampler stored these params as a pruned trial without a trial taking them: log it as
        the objective logs an invalid config, and count the trial it added (no callback sees it),
        so `_alone` keeps telling this process's trials from another's."""
        self.record(params, Measurement(INVALID, reason=reason))
        with self.state:
            self.ledger.total += 1

    def record(self, params: dict[str, int], m: Measurement) -> None:
        """Log a trial in the config database. An invalid config's row waits for the next
        measurement's transaction (or `flush`, when the search ends): refused proposals are most
        of a key's trials, and a commit each held the write lock of an SQLite file that the other
        tuner processes of the job wait on. A killed process loses only waiting rows of this log
        (Optuna's storage has every refused config as a pruned trial); the counts of measured
        trials, which the claims read, are written with their measurement."""
        with self.log_lock:
            self.unlogged.append((params, m))
            if m.state == INVALID:
                return
            rows, self.unlogged = self.unlogged, []
        self._write_log(rows)

    def flush(self) -> None:
        """Write the invalid configs' rows still waiting (the search is over)."""
        with self.log_lock:
            rows, self.unlogged = self.unlogged, []
        if rows:
            self._write_log(rows)

    def _write_log(self, rows: list[tuple[dict[str, int], Measurement]]) -> None:
        with session_scope(self.sessions) as s:
            for params, m in rows:
                repo.record_trial(
                    session=s,
                    study_id=self.out.study_id,
                    params=params,
                    state=m.state,
                    reason=m.reason,
                    median_us=m.median_us,
                    p10_us=m.p10_us,
                    p90_us=m.p90_us,
                    samples=m.samples or None,
                    rel_error=m.rel_error,
                )

    def objective(self, trial: optuna.Trial) -> float:
        n = trial.number
        try:
            with self.state:
                self.mine.add(n)
                self.waiting.add(n)
                while self.proposer is not None or min(self.waiting) != n or self._spent():
                    self.state.wait()
                self.waiting.discard(n)
                self.proposer = n
            return self._objective(trial)
        except BudgetSpent as exc:
            trial.set_user_attr(REASON_ATTR, str(exc))
            raise
        except BaseException:
            self._forget(n)  # a failure Optuna does not catch: no callback will tidy up
            raise
        finally:
            with self.state:
                self.mine.discard(n)
                self.waiting.discard(n)
                self._done_proposing(n)

    def _forget(self, number: int) -> None:
        with self.state:
            self.reserved.discard(number)
            self.own = {sig: n for sig, n in self.own.items() if n != number}
            self.state.notify_all()

    def _objective(self, trial: optuna.Trial) -> float:
        params = {p: trial.suggest_categorical(p, self.choices[p]) for p in PARAMS}
        cfg = KernelConfig.from_params(params)
        key = self.out.key
        reason = self.refusal(params)
        if reason is not None:  # never compiled, never run, not counted against the budget
            self.record(params, Measurement(INVALID, reason=reason))
            trial.set_user_attr(STATE_ATTR, INVALID)
            trial.set_user_attr(REASON_ATTR, reason[:500])
            raise optuna.TrialPruned(reason)
        prev = self._measured_before(params, trial.number)
        if prev is not None:  # answered from the stored measurement
            trial.set_user_attr("reused_trial", prev.number)
            for k in (STATE_ATTR, REASON_ATTR):
                if k in prev.user_attrs:
                    trial.set_user_attr(k, prev.user_attrs[k])
            if prev.value is None:  # a failed measurement: pruned again, as the first one was
                raise optuna.TrialPruned(prev.user_attrs.get(REASON_ATTR, "failed before"))
            return prev.value
        self._reserve(trial.number)
        self.backend.compile_ahead(cfg, key.q_len)  # in this thread, while another trial measures
        with self.gpu:  # one measurement at a time; its storage writes (below) do not hold the GPU
            m = self.backend.measure(cfg, self.workload)
        return self._measured(trial, params, cfg, m)

    def _measured_before(self, params: dict[str, int], number: int) -> optuna.trial.FrozenTrial | None:
        """The finished measurement of these params, if any thread or process made one. A twin
        in flight is waited for: one of this process (whichever registered the config first),
        or an earlier trial of another process (only earlier ones, so two twins never wait for
        each other; an earlier trial whose params are still being written may be one). So one
        config is never measured twice."""
        sig = tuple(params[p] for p in PARAMS)
        with self.state:
            while (prev := self.ledger.known.get(sig)) is None and self.own.get(sig, number) != number:
                self._done_proposing(number)  # the next trial proposes while this one waits
                self.state.wait()  # this process measures it in another thread: its callback wakes us
            if prev is not None:
                return prev
            self.own[sig] = number
            if self._alone(number):
                return None
        deadline = time.monotonic() + TWIN_WAIT_S
        while True:
            trials = self.ledger.study.get_trials(deepcopy=False)
            same = [t for t in trials if t.number != number and tuple(t.params.get(p) for p in PARAMS) == sig]
            if any(t.state.is_finished() and t.user_attrs.get(MEASURED_ATTR) for t in same):
                with self.state:
                    self.ledger.refresh()  # another process measured it since the ledger last looked
                    return self.ledger.known.get(sig)
            with self.state:
                mine = set(self.mine)
            running = any(
                t.state == optuna.trial.TrialState.RUNNING
                and t.number < number
                and t.number not in mine
                and (t in same or len(t.params) < len(PARAMS))
                for t in trials
            )
            if not running or time.monotonic() > deadline:
                return None
            with self.state:
                self._done_proposing(number)  # the next trial proposes while this one waits
            time.sleep(0.2)

    def _alone(self, number: int) -> bool:
        """No other process is running a trial of this study, and none has added one since the
        ledger last read them: the ledger (and this process's registry of configs in flight) is
        the whole truth -- the common case, checked with two small queries instead of reading
        every trial. Called with `state` held."""
        running = self.ledger.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        if any(t.number not in self.mine for t in running):
            return False
        storage = self.ledger.study._storage
        return storage.get_n_trials(self.ledger.study._study_id) <= self.ledger.total + len(self.mine)

    def _measured(self, trial: optuna.Trial, params: dict[str, int], cfg: KernelConfig, m: Measurement) -> float:
        """Store a measurement: the config database's row (with the invalid rows waiting for it)
        and the trial's attributes -- a commit to the database every tuner process of the job
        shares, and two or three of Optuna's. Outside the GPU lock, so waiting on those writes never
        leaves the GPU idle."""
        self.record(params, m)
        trial.set_user_attr(MEASURED_ATTR, True)
        trial.set_user_attr(STATE_ATTR, m.state)
        if m.reason:
            trial.set_user_attr(REASON_ATTR, m.reason[:500])
        if not m.ok:  # pruned, not failed: TPE ranks a pruned trial among the worst and steers away
            # from it, where a failed one is invisible to it and its config is proposed again and
            # again (each answered from storage) until the trial cap
            raise optuna.TrialPruned(m.reason or m.state)
        with self.state:  # the spread (p10/p90) is in the config database's row, not a write each here
            if cfg == self.out.default:
                self.default_us = m.median_us
            if self.best_us is None or m.median_us < self.best_us:  # type: ignore[operator]
                self.best_us = m.median_us
        return m.median_us  # type: ignore[return-value]

    def after_trial(self, st: optuna.Study, ft: optuna.trial.FrozenTrial) -> None:
        """Optuna's callback: progress, and stop at the budget (or when nothing new is proposed)."""
        with self.state:
            self.ledger.after_trial(ft)  # counted by the ledger now: its place and its config are known
            self.reserved.discard(ft.number)
            self.own = {sig: n for sig, n in self.own.items() if n != ft.number}
            self.state.notify_all()
            progress = Progress(
                self.out.key,
                self.ledger.measured,
                self.budget,
                self.best_us,
                self.default_us,
                f"{ft.params} -> {ft.user_attrs.get(STATE_ATTR, ft.state.name)}",
            )
            stop = self.done or self.ledger.total >= 20 * self.budget + self.n_valid
        if self.on_progress:
            self.on_progress(progress)
        if stop:
            st.stop()
