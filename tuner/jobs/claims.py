"""Sharing out the keys of one tuning job between tuner processes: the GPUs of one host
(`--devices 0,1`) or the same command on several hosts against one PostgreSQL.

Each key (one Optuna study) has at most one **owner**: the process that claimed it in the config
database (one atomic UPDATE, verify_tuner.store.studies.claim_study) and beats every CLAIM_BEAT_S. Only the
owner re-times the top candidates and stores the winner, so every key's winner is picked and
stored once. A process walks the job's keys in order from its own starting key (process i of P
on one host starts at key i*K/P of K and wraps around) and claims the first free one; when every
remaining key is owned by a live process it **helps** with the search of one whose budget has
more places left than twice its owner's trials in flight (trials are shared through Optuna's
storage, so nothing is measured twice), and otherwise waits for the owners. Each process takes
places in the budget from its own count (the other's trials in flight are not in it): an owner's
trials in flight already take the last places, and a helper that joins there adds its own proposals,
storage writes and measurements past the budget to the owner's key, which slows the owner down
instead of helping it. A key whose study finished with its budget measured is done and skipped (a
re-run of the job, or another process that got there first). An owner killed with -9 stops beating:
after CLAIM_STALE_S another process (or the re-run) claims the key and resumes its study, whose
heartbeat-failed trials Optuna retries.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import partial

from sqlalchemy.orm import Session, sessionmaker
from verify_tuner import space
from verify_tuner.keys import ConfigKey
from verify_tuner.measure.backend import Backend, Workload
from verify_tuner.search.key_search import Progress
from verify_tuner.search.outcome import Outcome
from verify_tuner.search.study import StudyOptions, key_study, run_study, workload_key
from verify_tuner.store import devices, models, studies
from verify_tuner.store.session import session_scope

CLAIM_BEAT_S = 5.0
#: A claim this old belongs to a dead process. Longer than any single step of an owner that does
#: not beat (the beat is a thread: measurements and compiles do not delay it).
CLAIM_STALE_S = 30.0
#: While every remaining key is owned by another live process: how long between claim attempts
#: (which also take a key whose owner went stale), and how often to look, read-only, whether an
#: owner has released its key meanwhile -- the look ends the wait, so the job's last process does
#: not sleep out a whole POLL_S after another process finished the key it was waiting for.
POLL_S = 1.0
WATCH_S = 0.05


def owner_id(device_ordinal: int) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:gpu{device_ordinal}"


@dataclass
class JobResult:
    outcomes: list[Outcome] = field(default_factory=list)  # keys this process owned
    done_before: list[Workload] = field(default_factory=list)  # finished already: skipped
    helped: list[Workload] = field(default_factory=list)  # searched for another owner
    #: keys owned by another live process that this process did not help: the places left in the
    #: budget when it first looked (too few to share: see the module docstring)
    declined: dict[Workload, int] = field(default_factory=dict)
    waited_s: float = 0.0  # idle: every remaining key owned by another live process, none helped


@contextlib.contextmanager
def _beating(sessions: sessionmaker[Session], study_id: int, owner: str) -> Iterator[threading.Event]:
    """Beat the claim from a thread while the body runs; the event is set if the claim was lost."""
    stop, lost = threading.Event(), threading.Event()

    def beat() -> None:
        while not stop.wait(CLAIM_BEAT_S):
            with session_scope(sessions) as s:
                if not studies.beat_study(session=s, study_id=study_id, owner=owner):
                    lost.set()
                    return

    t = threading.Thread(target=beat, name=f"claim-{study_id}", daemon=True)
    t.start()
    try:
        yield lost
    finally:
        stop.set()
        t.join()


_DONE = -1


def _held(lost: threading.Event) -> bool:
    """Whether this process still owns the key (its claim's beat has not been lost)."""
    return not lost.is_set()


def _claim(
    sessions: sessionmaker[Session], key: ConfigKey, wl: Workload, owner: str, budget: int, options: StudyOptions
) -> int | None:
    """Claim the key's study: its id when this process now owns it, _DONE when it is finished with
    its budget measured (a re-run, or another process got there first), None when a live process
    owns it. The claim comes first and the check after, on the row this process then owns: a
    check before the claim could read a study that its owner finishes and releases before the
    claim's UPDATE, and the key would be tuned twice."""
    with session_scope(sessions) as s:
        study_id = key_study(s, key, wl, options, reopen=False).id
    stale = models.utcnow() - timedelta(seconds=CLAIM_STALE_S)
    with session_scope(sessions) as s:  # one transaction: the claim's UPDATE holds the row for the check
        if not studies.claim_study(session=s, study_id=study_id, owner=owner, stale_before=stale):
            return None
        row = s.get_one(models.Study, study_id, populate_existing=True)
        if row.status == "finished" and row.n_ok + row.n_failed >= budget:
            studies.release_study(session=s, study_id=study_id, owner=owner)
            return _DONE
    return study_id


@dataclass(frozen=True)
class _Job:
    """What every key of one job shares: how to measure, store and search it."""

    backend: Backend
    sessions: sessionmaker[Session]
    n_trials: int
    owner: str
    options: StudyOptions
    restrict: dict[str, list[int]] | None
    on_progress: Callable[[Progress], None] | None

    def key(self, wl: Workload) -> ConfigKey:
        return workload_key(self.backend.limits, wl)

    def budget(self, wl: Workload) -> int:  # space.valid_configs is cached per (H, q_len, batch)
        limits = self.backend.limits
        valid = space.valid_configs(limits, H=wl.H, q_len=wl.q_len, restrict=self.restrict, kv_dtype=wl.kv_dtype)
        return min(self.n_trials, len(valid))

    def search(
        self, wl: Workload, *, pick: bool, options: StudyOptions, owns: Callable[[], bool] | None = None
    ) -> Outcome:
        return run_study(
            backend=self.backend,
            sessions=self.sessions,
            workload=wl,
            n_trials=self.n_trials,
            options=options,
            restrict=self.restrict,
            pick=pick,
            owns=owns,
            on_progress=self.on_progress,
        )


def run_job(
    *,
    backend: Backend,
    sessions: sessionmaker[Session],
    workloads: list[Workload],
    n_trials: int,
    owner: str,
    options: StudyOptions,
    restrict: dict[str, list[int]] | None = None,
    on_key_done: Callable[[], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    place: tuple[int, int] = (0, 1),
) -> JobResult:
    """Tune every key of `workloads` together with whatever other processes run the same job.

    `place` is this process's (index, count) among the job's processes on this host: it starts
    its walk at key index*K/count, so each process goes on to its own last key's neighbour -- whose
    best is then stored to start from (verify_tuner.search.warm_start.warm_start_configs) and whose compiles are
    cached -- as a lone process does, instead of the processes taking alternate keys side by side.
    Processes of other hosts start where their own index says; a claim taken meanwhile is skipped."""
    index, count = place
    if not 0 <= index < count:
        raise ValueError(f"place {place}: the index must be in [0, count)")
    job = _Job(backend, sessions, n_trials, owner, options, restrict, on_progress)
    result = JobResult()
    pending = list(dict.fromkeys(workloads))
    first = index * len(pending) // count
    pending = pending[first:] + pending[:first]  # finished keys leave it: a rescan walks on from here
    with session_scope(sessions) as s:  # alone: it locks data_version, which winners' writes also take
        devices.upsert_device(session=s, limits=backend.limits)
    while pending:
        if _own_one(job, pending, result):
            if on_key_done:
                on_key_done()
            continue  # rescan from the top: keys finished meanwhile are dropped
        if pending and not _help_one(job, pending, result):
            t = time.monotonic()
            _wait_for_a_release(sessions, [job.key(wl).study_label(wl.neighbour_mb) for wl in pending], POLL_S)
            result.waited_s += time.monotonic() - t
    return result


def _own_one(job: _Job, pending: list[Workload], result: JobResult) -> bool:
    """Claim the first free key of `pending` and tune it; drops the keys found done on the way.
    False when every remaining key is owned by a live process."""
    for wl in list(pending):
        study_id = _claim(job.sessions, job.key(wl), wl, job.owner, job.budget(wl), job.options)
        if study_id == _DONE:
            pending.remove(wl)
            result.done_before.append(wl)
            continue
        if study_id is None:
            continue
        try:
            with _beating(job.sessions, study_id, job.owner) as lost:
                out = job.search(wl, pick=True, options=job.options, owns=partial(_held, lost))
        except BaseException:
            # Ctrl-C or a failed search: let the key go now, so a re-run claims it at once instead of
            # waiting out the claim's expiry (which is for a process killed outright); the error in
            # flight is the one to report, so a release that fails too is left to that expiry.
            with contextlib.suppress(Exception):
                _release(job, study_id)
            raise
        _release(job, study_id)
        result.outcomes.append(out)
        pending.remove(wl)
        return True
    return False


def _release(job: _Job, study_id: int) -> None:
    with session_scope(job.sessions) as s:
        studies.release_study(session=s, study_id=study_id, owner=job.owner)


def _help_one(job: _Job, pending: list[Workload], result: JobResult) -> bool:
    """Help with the search of the first owned key whose budget has more places left than twice
    its owner's trials in flight (an owner's flights are as many as this process's: one job)."""
    for wl in pending:
        with session_scope(job.sessions) as s:
            row = studies.find_study(session=s, key=job.key(wl), neighbour_mb=wl.neighbour_mb)
            left = job.budget(wl) - (row.n_ok + row.n_failed) if row is not None else 0
        if left > 2 * max(1, job.options.parallel):
            # its own seed: the owner samples with the job's, and lockstep would repeat its proposals
            seed = (zlib.crc32(job.owner.encode()) + (job.options.seed or 0)) % (2**31 - 1)  # an INTEGER column
            job.search(wl, pick=False, options=replace(job.options, seed=seed))
            result.helped.append(wl)
            return True
        result.declined.setdefault(wl, max(0, left))  # below 0: helpers measured past the budget
    return False


def _wait_for_a_release(sessions: sessionmaker[Session], names: list[str], timeout_s: float) -> None:
    """Return once one of the studies `names` (ConfigKey.study_label) has no owner (its owner
    finished or released it), or after `timeout_s`; one read-only query every WATCH_S."""
    deadline = time.monotonic() + timeout_s
    while True:
        with session_scope(sessions) as s:
            owners = studies.owners_of(session=s, workload_keys=names)
        if len(owners) < len(names) or None in owners.values():
            return
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(WATCH_S, left))
