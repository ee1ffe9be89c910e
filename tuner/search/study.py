"""One Optuna study per workload key: open or resume it, warm start, run the search (verify_tuner.search.trials
drives each trial), then pick and store the winner (verify_tuner.search.winner).

Data flow: kernels (validate/compile/launch) -> this module (through a Backend) -> the config
database (verify_tuner.store.repo) -> the API.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from sqlalchemy.orm import Session, sessionmaker
from verify_tuner import batches, buckets, space
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels import kernel_hash
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.validate import check
from verify_tuner.keys import ConfigKey
from verify_tuner.measure.backend import OK, Backend, Workload
from verify_tuner.search.outcome import Outcome
from verify_tuner.search.trials import STATE_ATTR, BudgetSpent, FitTPE, Progress, Search, WarmFirst, refusal
from verify_tuner.search.winner import pick_winner
from verify_tuner.store import repo
from verify_tuner.store.session import make_engine, session_scope
from verify_tuner.study_files import STUDY, study_file_url

#: Optuna's heartbeat: a trial whose process stops beating for HEARTBEAT_GRACE x this (kill -9, a
#: lost host) is failed by the next process that opens the study and retried with its params.
HEARTBEAT_S = 10.0
HEARTBEAT_GRACE = 3


def _params(cfg: KernelConfig) -> dict[str, int]:
    return cfg.as_params()


def _trials_without_fsync(storage: optuna.storages.RDBStorage) -> None:
    """Optuna's own connections to an SQLite file commit with synchronous=NORMAL: in WAL mode a
    commit then skips its fsync (the WAL is synced at checkpoints and by the next FULL commit),
    which survives a killed process but may lose the last trials to a power cut -- they are
    re-run on resume. Trials are ~10 commits each, the bulk of a key's writes; the config
    database's own writes (best configs, claims: verify_tuner.store.session.make_engine) keep FULL."""
    from sqlalchemy import event

    @event.listens_for(storage.engine, "connect")
    def _normal(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    storage.engine.dispose()  # connections made while Optuna created its tables: made again


def open_study_storage(template: str, study_name: str, heartbeat_s: float | None = None) -> optuna.storages.BaseStorage:
    """The storage of one study (open_storage). A file of its own is created by whoever opens it
    first -- an owner and a process helping it may do so at once -- one at a time (the flock of
    `tuner db upgrade`), as a copy of an empty Optuna storage (_blank_storage)."""
    url = study_file_url(template, study_name)
    if url == template:
        return open_storage(url, heartbeat_s)
    from sqlalchemy.engine import make_url
    from verify_tuner.store import migrate

    path = Path(make_url(url).database).expanduser()  # type: ignore[arg-type]
    with migrate.upgrade_lock(url):  # creates the file empty; no connection has a transaction open on it
        if path.stat().st_size == 0:  # put in place whole (a kill mid-copy leaves only a hidden .tmp file)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            shutil.copyfile(_blank_storage(path.parent), tmp)
            os.replace(tmp, path)  # a process waiting on the empty file's lock then sees this one
        return open_storage(url, heartbeat_s)


def prepare_study_storage(url: str) -> None:
    """What `tuner db upgrade` does for the study storage, so that tuners starting together on
    several GPUs never race to create it: a shared storage gets Optuna's tables (one process at a
    time); a file per key, its directory and the blank storage new files copy (so a job's first
    key does not make it)."""
    from verify_tuner.store import migrate

    if STUDY not in url:
        with migrate.upgrade_lock(url):  # Optuna creates its tables on first open: one at a time
            open_storage(url)
        return
    from sqlalchemy.engine import make_url
    from verify_tuner.store.session import check_writable

    path = Path(make_url(url).database).expanduser()  # type: ignore[arg-type]
    check_writable(path)  # creates the directory, or says how to make it writable
    _blank_storage(path.parent)


def _blank_storage(directory: Path) -> Path:
    """An SQLite file holding Optuna's empty schema (this Optuna version's, in WAL mode, nothing in
    its -wal), made once per directory: Optuna creating its schema loads its alembic revisions to
    stamp the version, far slower than copying a file, and a one-GPU table would pay it every key."""
    blank = directory / f".blank-optuna-{optuna.__version__}.db"
    url = f"sqlite:///{blank}"
    from verify_tuner.store import migrate

    with migrate.upgrade_lock(url):
        if blank.stat().st_size == 0:
            storage = open_storage(url)
            with storage.engine.connect() as c:
                c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            storage.engine.dispose()
    return blank


def open_storage(url: str, heartbeat_s: float | None = None) -> optuna.storages.BaseStorage:
    """Optuna's RDB storage at `url`, creating its schema if needed; with `heartbeat_s`, running
    trials beat and stale ones are failed and retried (RetryHeartbeatStaleTrialCallback).

    `tuner db upgrade` calls this up front; the retry covers workers that start together on a
    fresh separate storage and race to create the same tables."""
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    if url.startswith("sqlite"):  # journal_mode=WAL is stored in the file: set it once, on a connection
        engine = make_engine(url)  # (the config database's engine sets it on connect; Optuna's does not)
        with engine.connect():
            pass
        engine.dispose()
        kwargs: dict[str, object] = {"connect_args": {"timeout": 60}}
    else:
        kwargs = {"pool_pre_ping": True}
    beat: dict[str, object] = {}
    if heartbeat_s is not None:
        beat = {
            "heartbeat_interval": max(1, round(heartbeat_s)),
            "grace_period": max(2, round(heartbeat_s * HEARTBEAT_GRACE)),
        }
    for attempt in range(5):
        try:
            with warnings.catch_warnings():  # Optuna marks the heartbeat experimental; pyproject pins it
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                if beat:
                    beat["heartbeat_stale_trial_callback"] = optuna.storages.RetryHeartbeatStaleTrialCallback(
                        max_retry=2
                    )
                storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs, **beat)
                if url.startswith("sqlite"):
                    _trials_without_fsync(storage)
                return storage
        except (IntegrityError, ProgrammingError):
            if attempt == 4:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


#: Finished trials (warm-start configs first, then random configs that fit) before TPE models them.
N_STARTUP = 4
#: The share of finished trials (at most 25) TPE models as the good ones (_good_share).
GOOD_SHARE = 0.25


def _good_share(n: int) -> int:
    """How many of n finished trials TPE models as the good ones: a quarter (at most 25), where
    Optuna's default is a tenth, a share sized for counts that included the refused proposals; FitTPE
    proposes configs that fit, and with a tenth its search settles early (replayed with
    bench/tpe_efficiency.py: bench/results/tpe_fit.md)."""
    return min(math.ceil(GOOD_SHARE * n), 25)


def _sampler(
    name: str, seed: int | None, choices: dict[str, list[int]], fits: Callable[[dict[str, int]], bool]
) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        with warnings.catch_warnings():  # multivariate TPE is marked experimental; it models the
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # constants jointly
            warnings.simplefilter("ignore", FutureWarning)  # gamma: deprecated in 4.9, kept until 6
            # constant_liar: processes sharing a study see each other's running trials as taken
            return FitTPE(
                choices=choices,
                fits=fits,
                seed=seed,
                n_startup_trials=N_STARTUP,
                multivariate=True,
                constant_liar=True,
                gamma=_good_share,
            )
    if name == "grid":
        return optuna.samplers.GridSampler(choices, seed=seed)
    raise ValueError(f"unknown sampler {name!r}: use tpe or grid")


def warm_start_configs(*, session: Session, key: ConfigKey, limits, workload: Workload) -> list[KernelConfig]:
    """The heuristic default, then stored bests of this key's other prefix buckets (nearest
    first, same batch bucket), then of the neighbouring batch buckets (nearest batch first, then
    nearest prefix), then of other H with the same q_len -- each only if valid here."""
    cands = [heuristic_config(limits, H=key.H, q_len=key.q_len, prefix=workload.prefix, batch=workload.batch)]
    here = buckets.by_index(key.bucket)
    same = repo.list_best_for(
        session=session, device=key.device, kernel_hash=key.kernel_hash, dtype=key.dtype, H=key.H, q_len=key.q_len
    )
    same.sort(
        key=lambda r: (
            abs(r.key.batch_bucket - key.batch_bucket),
            buckets.log_distance(buckets.by_index(r.key.bucket), here),
        )
    )
    others = [r for r in repo.list_best(session=session, device=key.device, q_len=key.q_len) if r.key.H != key.H]
    for r in same + others:  # as stored: NSPLIT is the grid's parts, which every batch shares
        cfg = r.config
        if cfg not in cands and check(cfg, limits, H=key.H, q_len=key.q_len) is None:
            cands.append(cfg)
    return cands


def workload_key(limits, workload: Workload) -> ConfigKey:  # type: ignore[no-untyped-def]
    return ConfigKey(
        limits.name,
        kernel_hash(),
        workload.dtype,
        workload.H,
        workload.q_len,
        buckets.bucket_of(workload.prefix).index,
        batches.bucket_of(workload.batch).index,
    )


def _open_study(
    key: ConfigKey,
    storage_url: str,
    heartbeat_s: float | None,
    sampler: str,
    seed: int | None,
    choices: dict[str, list[int]],
    warm: list[KernelConfig],
    fits: Callable[[dict[str, int]], bool],
) -> tuple[optuna.Study, list[dict[str, int]]]:
    """The key's Optuna study (created or resumed) with its plain sampler, and the warm-start
    configs the study has not seen (run_study wraps the sampler in search.WarmFirst)."""
    storage = open_study_storage(storage_url, key.study_name, heartbeat_s)
    study = optuna.create_study(
        study_name=key.study_name,
        storage=storage,
        direction="minimize",
        sampler=_sampler(sampler, seed, choices, fits),
        load_if_exists=True,
    )
    study.set_user_attr("workload_key", str(key))
    seen = {tuple(sorted(t.params.items())) for t in study.get_trials(deepcopy=False)}
    queue = [_params(c) for c in warm if all(v in choices[k] for k, v in _params(c).items())]
    return study, [q for q in queue if tuple(sorted(q.items())) not in seen]


def run_study(
    *,
    backend: Backend,
    sessions: sessionmaker[Session],
    storage_url: str,
    workload: Workload,
    n_trials: int,
    sampler: str = "tpe",
    seed: int | None = None,
    timeout_s: float | None = None,
    top_k: int = 3,
    rounds: int = 4,
    on_progress: Callable[[Progress], None] | None = None,
    restrict: dict[str, list[int]] | None = None,
    heartbeat_s: float | None = HEARTBEAT_S,
    pick: bool = True,
    owns: Callable[[], bool] | None = None,
    parallel: int = 1,
) -> Outcome:
    """Search, pick the winner, store it. `restrict` narrows the choices of some constants
    (e.g. {"STAGES": [2]}); `n_trials` counts measurements, not invalid or repeated configs.
    `pick=False` only helps with the search of a key another process owns (verify_tuner.jobs.claims): the
    owner alone re-times the top candidates and stores the winner; `owns()` False at that point
    (the claim went stale and another process took the key over) leaves the storing to it.
    `parallel` trials are in flight at once: each compiles in its own thread while one at a time
    measures (Optuna's n_jobs; the sampler's constant liar keeps their proposals apart)."""
    t0 = time.perf_counter()
    limits = backend.limits
    key = workload_key(limits, workload)
    choices = space.choices(key.H, restrict, limits, q_len=key.q_len)
    valid = space.valid_configs(limits, H=key.H, q_len=key.q_len, restrict=restrict)
    if not valid:
        raise InvalidConfig(f"no valid config for H={key.H}, q_len={key.q_len} on {limits.name}")
    with session_scope(sessions) as s:  # its own transaction: it locks data_version (see repo.upsert_kernel)
        repo.upsert_device(session=s, limits=limits)
    with session_scope(sessions) as s:
        # a helper must not reopen a study its owner just finished: the key would look unclaimed
        study_row = repo.get_or_create_study(
            session=s, key=key, prefix=workload.prefix, sampler=sampler, seed=seed, reopen=pick
        )
        warm = warm_start_configs(session=s, key=key, limits=limits, workload=workload)
    out = Outcome(key, workload, study_row.id, default=warm[0])

    # a helper leaves the warm start to the owner, whose proposals it would otherwise repeat
    def fits(params: dict[str, int]) -> bool:
        return refusal(params, limits, key) is None

    study, queue = _open_study(key, storage_url, heartbeat_s, sampler, seed, choices, warm if pick else [], fits)
    search = Search(
        backend=backend,
        sessions=sessions,
        workload=workload,
        out=out,
        study=study,
        choices=choices,
        n_valid=len(valid),
        budget=min(n_trials, len(valid)),
        on_progress=on_progress,
    )
    if sampler != "grid":  # a grid sweeps every config anyway, invalid ones pruned by the objective
        study.sampler = WarmFirst(
            study.sampler, queue, choices, reject=search.refusal, refused=search.refused, valid=valid, seed=seed
        )
    if sampler == "grid":  # the grid is known: build it all up front, on every core (nvcc is single-threaded)
        from concurrent.futures import ThreadPoolExecutor

        todo = [c for c in valid if tuple(_params(c).values()) not in search.ledger.known]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(lambda c: backend.compile_ahead(c, key.q_len), todo))
    if not search.done:
        if parallel > 1:
            _one_ask_at_a_time(study)
        try:
            study.optimize(
                search.objective,
                timeout=timeout_s,
                callbacks=[search.after_trial],
                gc_after_trial=False,
                n_jobs=parallel,
                catch=(BudgetSpent,),
            )
        finally:
            search.flush()
    if not pick:
        out.decision = "helped with the search (another process owns the key)"
    else:
        pick_winner(
            out,
            ranked=_ranked_configs(study),
            backend=backend,
            sessions=sessions,
            workload=workload,
            top_k=top_k,
            rounds=rounds,
            owns=owns,
        )
        with session_scope(sessions) as s:
            repo.finish_study(session=s, study_id=out.study_id)
            row = s.get(repo.Study, out.study_id)
            out.counts = {"trials": row.n_trials, "ok": row.n_ok, "invalid": row.n_invalid, "failed": row.n_failed}
    out.wall_s = time.perf_counter() - t0
    return out


def _one_ask_at_a_time(study: optuna.Study) -> None:
    """Serialise this study object's `ask` across Optuna's n_jobs threads. A queued trial (the
    heartbeat's retry of a killed process's trial) goes to whoever marks it running first, and on
    SQLite nothing locks it in between: two threads asking at once both took it (one measured it,
    the other failed telling it). The threads' proposals are serialised anyway (verify_tuner.search.trials)."""
    lock = threading.Lock()
    ask = study.ask

    def locked_ask(*args: Any, **kwargs: Any) -> optuna.Trial:
        with lock:
            return ask(*args, **kwargs)

    study.ask = locked_ask  # type: ignore[method-assign]


def _ranked_configs(study: optuna.Study) -> list[KernelConfig]:
    """Distinct configs of the study's measured trials that passed the gate, fastest first."""
    ok = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.user_attrs.get(STATE_ATTR) == OK and t.value is not None
    ]
    return list(dict.fromkeys(KernelConfig.from_params(t.params) for t in sorted(ok, key=lambda t: t.value)))
