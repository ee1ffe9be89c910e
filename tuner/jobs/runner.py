"""Run studies for a list of workloads on one GPU, or on several GPUs at once (one process per
GPU, all sharing one config database and the study storage: one Optuna storage, or an SQLite file
per key)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from verify_tuner.measure.backend import Workload
from verify_tuner.measure.gpu_backend import DEFAULT_MEASURER, IsolatedBackend
from verify_tuner.settings import Settings

if TYPE_CHECKING:  # verify_tuner.jobs.claims imports Optuna and SQLAlchemy: not before the measuring child starts
    from verify_tuner.jobs.claims import JobResult
    from verify_tuner.search.outcome import Outcome


@dataclass(frozen=True)
class TuneJob:
    workloads: list[Workload]
    n_trials: int
    sampler: str = "tpe"
    seed: int | None = None
    timeout_s: float | None = None
    storage_url: str | None = None
    measure_timeout_s: float = 120.0
    restrict: dict[str, list[int]] = field(default_factory=dict)
    measurer: str = DEFAULT_MEASURER
    #: trials in flight per GPU: each compiles in its own thread while one at a time measures
    compile_jobs: int = 1


def default_compile_jobs(n_devices: int) -> int:
    """This host's cores shared by its tuner processes, at most 8 trials in flight each (more
    would mostly make TPE propose with less information)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cores // max(1, n_devices)))


def tune_on_device(
    settings: Settings,
    job: TuneJob,
    device_ordinal: int,
    on_progress: Callable[[Any], None] | None = None,
    on_key_done: Callable[[], None] | None = None,
    place: tuple[int, int] = (0, 1),
) -> JobResult:
    """The workloads of `job` on GPU `device_ordinal`, sharing the keys with every other process
    that runs the same job on the same databases (verify_tuner.jobs.claims): other GPUs of this host, or
    other hosts. The measuring child starts first: its start (seconds, most of it importing torch)
    is what the job's first measurement waits for, and this process's imports, database check and
    first compiles overlap it. Optuna's own log lines (one per trial) are turned off; `on_progress`
    says what matters. `place` is this process's (index, count) among the job's processes on this
    host: where it starts its walk through the keys (verify_tuner.jobs.claims.run_job)."""
    backend = IsolatedBackend(
        measurer=job.measurer,
        measurer_kwargs={"cache_dir": str(settings.cache_dir)} if job.measurer == DEFAULT_MEASURER else {},
        device_ordinal=device_ordinal,
        timeout_s=job.measure_timeout_s,
    )
    try:
        import optuna
        from verify_tuner.jobs.claims import owner_id, run_job
        from verify_tuner.search.study import StudyOptions
        from verify_tuner.store.migrate import checked_sessions

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        sessions = checked_sessions(settings.database_url)
        options = StudyOptions(
            storage_url=job.storage_url or settings.studies,
            sampler=job.sampler,
            seed=job.seed,
            timeout_s=job.timeout_s,
            parallel=job.compile_jobs,
        )
        return run_job(
            backend=backend,
            sessions=sessions,
            workloads=job.workloads,
            n_trials=job.n_trials,
            owner=owner_id(device_ordinal),
            options=options,
            restrict=job.restrict or None,
            on_key_done=on_key_done,
            on_progress=on_progress,
            place=place,
        )
    finally:
        backend.close()


@dataclass(frozen=True)
class DeviceResult:
    """What one GPU's process of a job reports: the keys it owned (summary), how many it helped
    with or found done, what it waited for (idle) -- or, when it failed, why (`error`)."""

    device: int
    error: str | None = None
    keys: list[dict[str, Any]] = field(default_factory=list)
    helped: int = 0
    done_before: int = 0
    waited_s: float = 0.0
    declined: list[dict[str, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def of(cls, device: int, res: JobResult) -> DeviceResult:
        return cls(
            device=device,
            keys=[summary(o) for o in res.outcomes],
            helped=len(res.helped),
            done_before=len(res.done_before),
            **idle(res),
        )

    def as_json(self) -> dict[str, Any]:
        """`tuner study start --devices --json`'s entry for this GPU."""
        if self.error is not None:
            return {"gpu": self.device, "status": "error", "result": self.error}
        result = {k: v for k, v in vars(self).items() if k not in ("device", "error")}
        return {"gpu": self.device, "status": "ok", "result": result}


def _ignore(signum: int, frame: Any) -> None:
    """A later Ctrl-C or SIGTERM while a stop unwinds: nothing."""


def stop_on_signals() -> None:
    """SIGTERM (a scheduler's stop, `kill`) ends the run as Ctrl-C does, with a KeyboardInterrupt
    whose unwinding fails the trials in flight, releases the claims and closes the measuring child.
    Only the first signal interrupts: a second one (Ctrl-C reaches every process of the group, and
    the parent then stops its GPU processes too) would cut that unwinding short."""

    def interrupt(signum: int, frame: Any) -> None:
        # A handler that does nothing rather than SIG_IGN: a signal that arrived before this swap
        # (Ctrl-C and the parent's stop landing together) is still run through the handler table,
        # and Python reports one whose handler became SIG_IGN as "ignored due to race condition",
        # with a traceback.
        signal.signal(signal.SIGINT, _ignore)
        signal.signal(signal.SIGTERM, _ignore)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def _hold_signals() -> dict[int, Any]:
    """SIGINT and SIGTERM ignored, with the handlers to put back (none off the main thread, where
    signals cannot be set)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}


def _device_main(settings: Settings, job: TuneJob, index: int, count: int, device_ordinal: int, queue: Any) -> None:
    stop_on_signals()
    try:
        res = tune_on_device(settings, job, device_ordinal, place=(index, count))
        queue.put((index, DeviceResult.of(device_ordinal, res)))
    except KeyboardInterrupt:  # stopped: its claims are released; the parent says so, in one line
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 -- the parent reports it and exits non-zero; a bug keeps its traceback
        import traceback

        from verify_tuner.errors import TunerError

        detail = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, TunerError):
            detail = traceback.format_exc()
        queue.put((index, DeviceResult(device_ordinal, error=detail)))


def summary(o: Outcome) -> dict[str, Any]:
    return {
        "key": str(o.key),
        "prefix": o.workload.prefix,
        "batch": o.workload.batch,
        "neighbour_mb": o.workload.neighbour_mb,
        "best": str(o.best) if o.best else None,
        "best_us": o.best_m.median_us if o.best_m else None,
        "decision": o.decision,
        "counts": o.counts,
        "wall_s": o.wall_s,
    }


def idle(res: JobResult) -> dict[str, Any]:
    """How long a process waited for keys other processes owned, and the places left in those
    it did not help (other GPUs of this host, or other hosts running the same job)."""
    return {
        "waited_s": round(res.waited_s, 1),
        "declined": [{"prefix": w.prefix, "batch": w.batch, "places_left": n} for w, n in res.declined.items()],
    }


def _start_method() -> Literal["spawn", "fork"]:
    """How the per-GPU processes start. A fork runs at once with the modules this process has
    imported (a spawned one imports the CLI's again first), and each process then starts its
    measuring child before it imports Optuna and SQLAlchemy (tune_on_device), as one GPU's job
    does: importing them here, before the fork, would delay every GPU's measuring child by those
    imports. A fork is safe only while this process runs no other thread (a lock held by one
    would stay held in the child) and has no CUDA context and no open database connection -- as
    `tuner study start` when it gets here: it only parsed and checked its arguments. Otherwise
    (a test runner, an embedding program) the processes are spawned."""
    import threading

    if os.name != "posix" or threading.active_count() > 1 or "pycuda.driver" in sys.modules:
        return "spawn"
    return "fork"


#: Seconds a stopped GPU process gets to release its claims and close its measuring child
#: (which itself gets 10 s to answer before it is killed).
STOP_GRACE_S = 30.0


def tune_on_devices(settings: Settings, job: TuneJob, devices: list[int]) -> list[DeviceResult]:
    """One process per GPU, sharing the job's keys (verify_tuner.jobs.claims: each key's winner is picked and
    stored once) and, at the end, the trials of the keys still running. An owner samples with the
    job's seed, as a lone process would (the processes then propose, and compile, the configs a
    single GPU would); a helper samples with its own seed so it does not propose in lockstep."""
    ctx = mp.get_context("fork") if _start_method() == "fork" else mp.get_context("spawn")
    queue = ctx.Queue()
    procs = []
    # The processes start with Ctrl-C and SIGTERM held off until _device_main takes them (a signal
    # in between interrupted the start itself, and multiprocessing printed its traceback); this one
    # takes them again once all are started.
    held = _hold_signals()
    try:
        for i, dev in enumerate(devices):
            p = ctx.Process(
                target=_device_main, args=(settings, job, i, len(devices), dev, queue), name=f"tuner-gpu{dev}"
            )  # not daemonic: it starts its own measuring child
            p.start()
            procs.append(p)
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
    results: dict[int, DeviceResult] = {}
    try:
        for _ in procs:  # one report per process, also when two processes share a GPU ("0,0")
            index, result = queue.get()
            results[index] = result
        for p in procs:
            p.join()
    except BaseException:
        # Ctrl-C or SIGTERM here: the GPUs' processes stop the same way (they would otherwise tune on,
        # and this process would wait for them at exit); one that does not end in time is killed
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(STOP_GRACE_S)
            if p.is_alive():
                p.kill()
                p.join()
        raise
    return [results[i] for i in sorted(results)]
