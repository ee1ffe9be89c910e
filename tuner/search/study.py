"""One Optuna study per workload key: open or resume it, warm start, run the search loop
(verify_tuner.search.loop: ask, check, compile, measure, tell), then pick and store the winner
(verify_tuner.search.winner).

Data flow: kernels (validate/compile/launch) -> this module (through a Backend) -> the config
database (verify_tuner.store.repo) -> the API.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from sqlalchemy.orm import Session, sessionmaker
from verify_tuner import batches, buckets, space
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels import kernel_hash
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.kernels.validate import check
from verify_tuner.keys import ConfigKey
from verify_tuner.measure.backend import OK, Backend, Workload
from verify_tuner.search.heartbeat import Heartbeat
from verify_tuner.search.key_search import STATE_ATTR, KeySearch, Progress, config_signature, refusal
from verify_tuner.search.ledger import Ledger, TrialLog
from verify_tuner.search.loop import Loop, Pipeline
from verify_tuner.search.outcome import Outcome
from verify_tuner.search.proposer import Proposer
from verify_tuner.search.winner import Winner, pick_winner
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
    `tuner db upgrade`), as a copy of an empty Optuna storage (_blank_study_file)."""
    url = study_file_url(template, study_name)
    if url == template:
        return open_storage(url, heartbeat_s)
    from sqlalchemy.engine import make_url
    from verify_tuner.store import migrate

    path = Path(make_url(url).database).expanduser()  # type: ignore[arg-type]
    with migrate.upgrade_lock(url):  # creates the file empty; no connection has a transaction open on it
        if path.stat().st_size == 0:  # put in place whole (a kill mid-copy leaves only a hidden .tmp file)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            shutil.copyfile(_blank_study_file(path.parent), tmp)
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
    _blank_study_file(path.parent)


def _blank_study_file(directory: Path) -> Path:
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


@dataclass(frozen=True)
class TpeSettings:
    """TPE's knobs, as TPESampler's public constructor takes them. A refused proposal is a pruned
    trial TPE learns from, so each of its proposals is modelled on every refusal it has seen."""

    #: finished trials (warm-start configs first, then configs drawn among those that fit)
    #: before TPE models them
    n_startup: int = 4
    #: candidates TPE draws from its model of the good trials per proposal
    n_ei_candidates: int = 24


@dataclass(frozen=True)
class StudyOptions:
    """How a key's study runs, the same for every key of a job (verify_tuner.jobs.claims)."""

    storage_url: str
    sampler: str = "tpe"
    seed: int | None = None
    timeout_s: float | None = None
    #: trials in flight: each compiles in its own thread while one at a time measures
    parallel: int = 1
    #: Optuna's heartbeat (None: off), which fails and retries a killed process's trials
    heartbeat_s: float | None = HEARTBEAT_S
    top_k: int = 3  # the search's fastest configs the winner phase re-times
    rounds: int = 4
    tpe: TpeSettings = field(default_factory=TpeSettings)


def _sampler(options: StudyOptions) -> optuna.samplers.BaseSampler:
    if options.sampler == "tpe":
        with warnings.catch_warnings():  # multivariate TPE is marked experimental; it models the
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # constants jointly
            # constant_liar: processes sharing a study see each other's running trials as taken
            return optuna.samplers.TPESampler(
                seed=options.seed,
                n_startup_trials=options.tpe.n_startup,
                n_ei_candidates=options.tpe.n_ei_candidates,
                multivariate=True,
                constant_liar=True,
            )
    if options.sampler == "grid":  # the proposer walks the configs that fit; the sampler is never asked
        return optuna.samplers.RandomSampler(seed=options.seed)
    raise ValueError(f"unknown sampler {options.sampler!r}: use tpe or grid")


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


def _open_study(key: ConfigKey, options: StudyOptions) -> tuple[optuna.Study, optuna.storages.BaseStorage]:
    """The key's Optuna study, created or resumed, with this process's sampler."""
    storage = open_study_storage(options.storage_url, key.study_name, options.heartbeat_s)
    study = optuna.create_study(
        study_name=key.study_name,
        storage=storage,
        direction="minimize",
        sampler=_sampler(options),
        load_if_exists=True,
    )
    study.set_user_attr("workload_key", str(key))
    return study, storage


def _unseen(study: optuna.Study, warm: list[KernelConfig], choices: dict[str, list[int]]) -> list[dict[str, int]]:
    """The warm-start configs inside the choices that the study has no trial of."""
    seen = {tuple(sorted(t.params.items())) for t in study.get_trials(deepcopy=False)}
    queue = [_params(c) for c in warm if all(v in choices[k] for k, v in _params(c).items())]
    return [q for q in queue if tuple(sorted(q.items())) not in seen]


def _precompile(backend: Backend, configs: list[KernelConfig], q_len: int) -> None:
    """Build every config now, on every core (nvcc is single-threaded): a grid is known up front."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(lambda c: backend.compile_ahead(c, q_len), configs))


def _prepare(
    *,
    backend: Backend,
    sessions: sessionmaker[Session],
    workload: Workload,
    options: StudyOptions,
    restrict: dict[str, list[int]] | None,
    pick: bool,
) -> tuple[ConfigKey, int, list[KernelConfig]]:
    """The key, its row in the config database (created or reopened) and its warm-start configs."""
    limits = backend.limits
    key = workload_key(limits, workload)
    if not space.valid_configs(limits, H=key.H, q_len=key.q_len, restrict=restrict):  # cached: _key_search's
        raise InvalidConfig(f"no valid config for H={key.H}, q_len={key.q_len} on {limits.name}")
    with session_scope(sessions) as s:  # its own transaction: it locks data_version (see repo.upsert_kernel)
        repo.upsert_device(session=s, limits=limits)
    with session_scope(sessions) as s:
        # a helper must not reopen a study its owner just finished: the key would look unclaimed
        study_row = repo.get_or_create_study(
            session=s, key=key, prefix=workload.prefix, sampler=options.sampler, seed=options.seed, reopen=pick
        )
        warm = warm_start_configs(session=s, key=key, limits=limits, workload=workload)
    return key, study_row.id, warm


def run_study(
    *,
    backend: Backend,
    sessions: sessionmaker[Session],
    workload: Workload,
    n_trials: int,
    options: StudyOptions,
    restrict: dict[str, list[int]] | None = None,
    pick: bool = True,
    owns: Callable[[], bool] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> Outcome:
    """Search, pick the winner, store it. `restrict` narrows the choices of some constants
    (e.g. {"STAGES": [2]}); `n_trials` counts measurements, not invalid or repeated configs.
    `pick=False` only helps with the search of a key another process owns (verify_tuner.jobs.claims): the
    owner alone re-times the top candidates and stores the winner; `owns()` False at that point
    (the claim went stale and another process took the key over) leaves the storing to it."""
    t0 = time.perf_counter()
    key, study_id, warm = _prepare(
        backend=backend, sessions=sessions, workload=workload, options=options, restrict=restrict, pick=pick
    )
    search = _key_search(key, workload, study_id, backend.limits, restrict, n_trials, options, warm[0])
    study, storage = _open_study(key, options)
    _search(study, storage, search, backend, sessions, options, warm if pick else [], on_progress)
    if not pick:
        winner = Winner(reason="helped with the search (another process owns the key)")
    else:
        winner = pick_winner(
            key=key,
            study_id=study_id,
            default=warm[0],
            ranked=_ranked_configs(study),
            backend=backend,
            sessions=sessions,
            workload=workload,
            top_k=options.top_k,
            rounds=options.rounds,
            owns=owns,
        )
    return Outcome.of(
        key, workload, study_id, warm[0], winner, _counts(sessions, study_id, pick), time.perf_counter() - t0
    )


def _key_search(
    key: ConfigKey,
    workload: Workload,
    study_id: int,
    limits: DeviceLimits,
    restrict: dict[str, list[int]] | None,
    n_trials: int,
    options: StudyOptions,
    default: KernelConfig,
) -> KeySearch:
    valid = space.valid_configs(limits, H=key.H, q_len=key.q_len, restrict=restrict)
    return KeySearch(
        key=key,
        workload=workload,
        study_id=study_id,
        choices=space.choices(key.H, restrict, limits, q_len=key.q_len),
        valid=valid,
        budget=min(n_trials, len(valid)),
        parallel=max(1, options.parallel),
        timeout_s=options.timeout_s,
        default=default,
    )


def _search(
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    search: KeySearch,
    backend: Backend,
    sessions: sessionmaker[Session],
    options: StudyOptions,
    warm: list[KernelConfig],
    on_progress: Callable[[Progress], None] | None,
) -> None:
    """The search loop (verify_tuner.search.loop) over this study, until the budget is measured."""
    ledger = Ledger(study)
    grid = options.sampler == "grid"
    if grid:  # a helper's warm start would repeat its owner's proposals; a grid has none
        _precompile(backend, [c for c in search.valid if config_signature(c) not in ledger.known], search.key.q_len)
    proposer = Proposer(
        study=study,
        search=search,
        ledger=ledger,
        log=TrialLog(sessions, search.study_id),
        reject=lambda params: refusal(params, backend.limits, search.key),
        warm=[] if grid else _unseen(study, warm, search.choices),
        n_startup=options.tpe.n_startup,
        grid=grid,
        seed=options.seed,
    )
    with Pipeline(backend, search.workload, search.parallel) as pipeline, Heartbeat(study, storage) as beat:
        Loop(
            study=study, search=search, proposer=proposer, pipeline=pipeline, heartbeat=beat, on_progress=on_progress
        ).run()


def _counts(sessions: sessionmaker[Session], study_id: int, pick: bool) -> dict[str, int]:
    """The owner finishes the study's row and reads its counts; a helper leaves both to it."""
    if not pick:
        return {}
    with session_scope(sessions) as s:
        repo.finish_study(session=s, study_id=study_id)
        row = s.get(repo.Study, study_id)
        return {"trials": row.n_trials, "ok": row.n_ok, "invalid": row.n_invalid, "failed": row.n_failed}


def _ranked_configs(study: optuna.Study) -> list[KernelConfig]:
    """Distinct configs of the study's measured trials that passed the gate, fastest first."""
    ok = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.user_attrs.get(STATE_ATTR) == OK and t.value is not None
    ]
    return list(dict.fromkeys(KernelConfig.from_params(t.params) for t in sorted(ok, key=lambda t: t.value)))
