"""One key's search loop on Optuna's ask/tell, in the shape its authors describe: one proposer
asks the study's sampler and checks each config before anything is built (a config `validate`
refuses is told to Optuna as a pruned trial with its reason, so TPE learns where the device's
limits are), a pool of threads compiles what it accepts (nvcc is single-threaded), and one thread
measures, one config at a time, while the loop tells each result back. Only the loop's thread
talks to the study. Several processes share one study through its RDB storage: the loop beats
its trials in flight with the storage's heartbeat, so a killed process's trials are failed and
queued again (RetryHeartbeatStaleTrialCallback) for whoever asks next.

Here: the compile pool and the measuring thread (Pipeline) and the loop that keeps them fed and
tells the results (Loop). The proposer is verify_tuner.search.proposer, the heartbeat
verify_tuner.search.heartbeat, the study's ledger and the trial log verify_tuner.search.ledger.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Self

import optuna
from optuna.trial import TrialState
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.measure.backend import Backend, Measurement, Workload
from verify_tuner.search.heartbeat import Heartbeat
from verify_tuner.search.key_search import MEASURED_ATTR, REASON_ATTR, STATE_ATTR, KeySearch, Progress
from verify_tuner.search.proposer import Proposal, Proposer

log = logging.getLogger(__name__)


class Pipeline:
    """Compiles configs in a pool of threads and measures them one at a time in another: the GPU
    is never shared, and a config compiles while the one before it measures. A lead config (the
    heuristic default, the baseline every later one is compared with) compiles on a thread of its
    own and is measured before any config submitted after it."""

    def __init__(self, backend: Backend, workload: Workload, compile_jobs: int) -> None:
        self.backend, self.workload = backend, workload
        self.compiling = ThreadPoolExecutor(max(1, compile_jobs), thread_name_prefix="compile")
        self.leading = ThreadPoolExecutor(1, thread_name_prefix="compile-lead")  # never queued behind waiters
        self.gpu = ThreadPoolExecutor(1, thread_name_prefix="measure")
        self._lead_queued = threading.Event()
        self._lead_queued.set()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._lead_queued.set()  # no compile thread waits for a lead that will not come
        for pool in (self.leading, self.compiling, self.gpu):
            pool.shutdown(wait=exc[0] is None, cancel_futures=True)

    def submit(self, cfg: KernelConfig, *, lead: bool = False) -> Future[Measurement]:
        if lead:
            self._lead_queued.clear()
            return self.leading.submit(self._build_then_measure_lead, cfg)
        return self.compiling.submit(self._build_then_measure, cfg)

    def _build_then_measure_lead(self, cfg: KernelConfig) -> Measurement:
        try:
            self.backend.compile_ahead(cfg, self.workload)
            measured = self.gpu.submit(self.backend.measure, cfg, self.workload)
        finally:
            self._lead_queued.set()
        return measured.result()

    def _build_then_measure(self, cfg: KernelConfig) -> Measurement:
        self.backend.compile_ahead(cfg, self.workload)
        self._lead_queued.wait()
        return self.gpu.submit(self.backend.measure, cfg, self.workload).result()


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
                    self.proposer.withdraw()
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
                lead = p.cfg == self.search.default and not self.in_flight
                self.in_flight[self.pipeline.submit(p.cfg, lead=lead)] = p

    def _result(self, p: Proposal, f: Future[Measurement]) -> Measurement:
        try:
            return f.result()
        except BaseException:
            self.study.tell(p.trial, state=TrialState.FAIL)
            raise

    def _failed_as_stale(self, p: Proposal) -> bool:
        """Whether the trial was failed while it was measured here: its heartbeat stopped for longer
        than the grace (this process suspended or stopped), so a heartbeat check -- another process's,
        or this one's on resuming -- failed it, and the storage's retry callback queued its config
        again. The measurement stays in the trial log; a retry measures the config anew."""
        frozen = next(t for t in self.study.get_trials(deepcopy=False) if t.number == p.trial.number)
        if frozen.state != TrialState.FAIL:
            return False
        log.warning(
            "%s: trial %d was failed as stale while it was measured (its heartbeat stopped for longer than the "
            "grace: was this process suspended?); its config is queued again while retries remain",
            self.search.key, p.trial.number,
        )  # fmt: skip
        return True

    def _told(self, p: Proposal, m: Measurement) -> None:
        """Store a measurement: its row in the config database, its trial's attributes and state."""
        self.log.record(p.params, m)
        try:
            p.trial.set_user_attr(MEASURED_ATTR, True)
            p.trial.set_user_attr(STATE_ATTR, m.state)
            if m.reason:
                p.trial.set_user_attr(REASON_ATTR, m.reason[:500])
            if m.ok:  # the spread (p10/p90) is in the config database's row
                self.study.tell(p.trial, m.median_us)
            else:  # pruned, not failed: TPE ranks it among the worst, where a failed one is invisible
                self.study.tell(p.trial, state=TrialState.PRUNED)  # to it and proposed again and again
        except optuna.exceptions.UpdateFinishedTrialError:
            if not self._failed_as_stale(p):
                raise  # finished by a tell of our own: a bug
            return
        if m.ok:
            if p.cfg == self.search.default:
                self.default_us = m.median_us
            if self.best_us is None or m.median_us < self.best_us:  # type: ignore[operator]
                self.best_us = m.median_us
        self.ledger.measured += 1
        if self.on_progress:
            s = self.search
            last = f"{p.params} -> {m.state}"
            self.on_progress(Progress(s.key, self.ledger.measured, s.budget, self.best_us, self.default_us, last))
