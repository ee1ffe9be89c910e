"""The loop's one proposer: asks the study's sampler for configs, answers at once those that need
no measurement (refused, measured before, in flight), and chooses the configs it queues itself
(the warm start, a start drawn among the configs that fit, a grid's order, the config that fits
nearest a refused one: Neighbours)."""

from __future__ import annotations

import functools
import os
import random
import socket
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import optuna
from optuna.trial import TrialState
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.measure.backend import INVALID, Measurement
from verify_tuner.search.key_search import (
    PARAMS,
    REASON_ATTR,
    REUSED_ATTR,
    STATE_ATTR,
    KeySearch,
    Signature,
    config_of,
    config_signature,
    signature,
)
from verify_tuner.search.ledger import ASKING_S, Ledger, TrialLog

#: The user attribute naming the process that queued a trial, so that it withdraws only its own.
QUEUED_BY_ATTR = "queued_by"


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
        return config_of(self.params)


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
        storage: optuna.storages.BaseStorage,
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
        self.storage = storage
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
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
            self._queue(self.repaired.as_params())
            self.repaired = None
        elif self.warm:
            self._queue(self.warm.pop(0))
        elif self.grid is not None:
            cfg = next((c for c in self.grid if config_signature(c) not in self.ledger.known), None)
            if cfg is None:
                self.exhausted = True
                return
            self._queue(cfg.as_params())
        elif self.ledger.modelled < self.n_startup and self.search.valid:
            self._queue(self.rng.choice(self.search.valid).as_params())
        else:
            return
        self.ledger.waiting += 1

    def _queue(self, params: dict[str, int]) -> None:
        self.study.enqueue_trial(params, user_attrs={QUEUED_BY_ATTR: self.token})

    def withdraw(self) -> int:
        """Fail this process's queued trials that no ask took, when it stops: processes asking at
        once can each take another's queued trial (an ask takes the oldest it sees), and the last
        one queued is then left waiting after every process stopped. Returns how many."""
        mine = [
            t
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            if t.user_attrs.get(QUEUED_BY_ATTR) == self.token
        ]
        if not mine:
            return 0
        study_id = self.storage.get_study_id_from_name(self.study.study_name)
        n = 0
        for t in mine:
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            if not self.storage.set_trial_state_values(trial_id, state=TrialState.RUNNING):
                continue  # another process's ask took it just now: it is theirs to measure
            self.storage.set_trial_user_attr(trial_id, REASON_ATTR, "not measured: queued when its process stopped")
            self.study.tell(t.number, state=TrialState.FAIL)
            n += 1
        return n

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
