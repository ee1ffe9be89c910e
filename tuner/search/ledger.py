"""What the search loop knows of its study: the trials every process sharing it has run, as of
the last read (Ledger), and the config database's row of each trial this process ran (TrialLog)."""

from __future__ import annotations

import time

import optuna
from optuna.trial import TrialState
from sqlalchemy.orm import Session, sessionmaker
from verify_tuner.measure.backend import INVALID, Measurement
from verify_tuner.search.key_search import MEASURED_ATTR, PARAMS, Signature, signature
from verify_tuner.store import studies
from verify_tuner.store.session import session_scope

#: How long an earlier trial of another process may still be writing its params (it is being
#: asked) before the proposer stops waiting to see whether it holds the same config.
ASKING_S = 2.0


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
                studies.record_trial(
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
