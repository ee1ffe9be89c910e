"""One Optuna study per workload key: open or resume it (in its storage:
verify_tuner.search.study_storage), warm start (verify_tuner.search.warm_start), run the search
loop (verify_tuner.search.loop: ask, check, compile, measure, tell), then pick and store the
winner (verify_tuner.search.winner).

Data flow: kernels (validate/compile/launch) -> this module (through a Backend) -> the config
database (verify_tuner.store.studies, verify_tuner.store.best_configs) -> the API.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import optuna
from sqlalchemy.orm import Session, sessionmaker
from verify_tuner import batches, buckets, space
from verify_tuner.errors import StudyStorageError
from verify_tuner.kernels import kernel_hash
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.formats import readable
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.keys import ConfigKey, TableKey
from verify_tuner.measure.backend import OK, Backend, Workload
from verify_tuner.search.heartbeat import Heartbeat
from verify_tuner.search.key_search import STATE_ATTR, KeySearch, Progress, config_of, config_signature, refusal
from verify_tuner.search.ledger import Ledger, TrialLog
from verify_tuner.search.loop import Loop, Pipeline
from verify_tuner.search.outcome import Outcome
from verify_tuner.search.proposer import Proposer
from verify_tuner.search.study_storage import HEARTBEAT_S, open_study_storage
from verify_tuner.search.warm_start import unseen, warm_start_configs
from verify_tuner.search.winner import Winner, pick_winner
from verify_tuner.store import devices, models, studies
from verify_tuner.store.session import session_scope


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
    #: search only these configs (None: every valid one): a recorded sweep's sample replayed, or an
    #: operator's short list; anything else TPE proposes is refused and its nearest listed config tried
    candidates: frozenset[KernelConfig] | None = None
    #: False: the search starts from TPE's own draws, not the heuristic and the neighbours' bests
    #: (what bench/tpe_efficiency.py --cold measures: the search on its own); the winner phase
    #: still re-times the heuristic beside the finalists
    warm_start: bool = True


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


def workload_key(limits: DeviceLimits, workload: Workload) -> ConfigKey:
    """The key `workload` is tuned under on `limits`' device, for the kernel of this package's source."""
    table = TableKey(limits.name, kernel_hash(), workload.kv_dtype, workload.H, workload.q_len)
    return table.at(buckets.bucket_of(workload.prefix).index, batches.bucket_of(workload.batch).index)


def key_study(s: Session, key: ConfigKey, workload: Workload, options: StudyOptions, *, reopen: bool) -> models.Study:
    """The config database's row of the key's study under the workload's timing (created on first
    use; a finished one reopened when `reopen`)."""
    return studies.get_or_create_study(
        session=s,
        key=key,
        prefix=workload.prefix,
        sampler=options.sampler,
        seed=options.seed,
        reopen=reopen,
        neighbour_mb=workload.neighbour_mb,
    )


#: Optuna's RDB tables (the config database's are tuning_trials, tuning_studies, ...): a failed
#: statement on one of them is the study storage's failure.
_OPTUNA_TABLES = re.compile(
    r"\b(?:from|into|update|join)\s+\"?(?:trials|trial_\w+|studies|study_\w+|version_info)\b", re.IGNORECASE
)


def _answers(storage: optuna.storages.BaseStorage | None) -> bool:
    """Whether the study storage takes a new connection and a statement now (a failure that names no
    statement -- a connection lost at checkout -- is the storage's only if it does not)."""
    from sqlalchemy import text
    from sqlalchemy.exc import InterfaceError, OperationalError
    from verify_tuner.store.session import make_engine

    engine = getattr(storage, "engine", None)
    if engine is None:
        return True
    # a connection of its own, as a restarted process would make (a pooled one may outlive the server)
    probe = make_engine(engine.url.render_as_string(hide_password=False), pooled=False, immediate=False, create=False)
    try:
        with probe.connect() as conn:
            conn.execute(text("SELECT 1"))
    except (OperationalError, InterfaceError):
        return False
    finally:
        probe.dispose()
    return True


@contextlib.contextmanager
def _study_storage_errors(
    url: str, *, opening: bool = False, storage: optuna.storages.BaseStorage | None = None
) -> Iterator[None]:
    """A study storage that is down or refuses, as a StudyStorageError naming it: the CLI reported
    such a database error as the config database's, which the operator had just migrated. Opening
    the storage, every such error is its; later, those of statements on Optuna's tables, and those
    naming no statement when the storage itself no longer answers."""
    from sqlalchemy.exc import InterfaceError, OperationalError
    from verify_tuner.store.session import error_line, safe_url

    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        if not opening:
            on_optuna = exc.statement is not None and _OPTUNA_TABLES.search(exc.statement) is not None
            if not on_optuna and (exc.statement or _answers(storage)):
                raise
        raise StudyStorageError(
            f"study storage unavailable: {error_line(exc)} ({safe_url(url)}; --storage or TUNER_STUDY_STORAGE sets it)"
        ) from exc


def _open_study(
    key: ConfigKey, options: StudyOptions, neighbour_mb: int = 0
) -> tuple[optuna.Study, optuna.storages.BaseStorage]:
    """The key's Optuna study under this timing, created or resumed, with this process's sampler."""
    name = key.study_name_for(neighbour_mb)
    with _study_storage_errors(options.storage_url, opening=True):
        storage = open_study_storage(options.storage_url, name, options.heartbeat_s)
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            direction="minimize",
            sampler=_sampler(options),
            load_if_exists=True,
        )
    study.set_user_attr("workload_key", str(key))
    study.set_user_attr("neighbour_mb", neighbour_mb)
    return study, storage


def _precompile(backend: Backend, configs: list[KernelConfig], workload: Workload) -> None:
    """Build every config now, on every core (nvcc is single-threaded): a grid is known up front."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(lambda c: backend.compile_ahead(c, workload), configs))


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
    readable(key.kv_dtype, limits.cc_major * 10 + limits.cc_minor)  # the format's own reason, not "no valid config"
    if not space.valid_configs(limits, H=key.H, q_len=key.q_len, restrict=restrict, kv_dtype=key.kv_dtype):
        raise InvalidConfig(f"no valid config for H={key.H}, q_len={key.q_len} on {limits.name}")
    with session_scope(sessions) as s:  # its own transaction: it locks data_version (see devices.upsert_kernel)
        devices.upsert_device(session=s, limits=limits)
    with session_scope(sessions) as s:
        # a helper must not reopen a study its owner just finished: the key would look unclaimed
        study_row = key_study(s, key, workload, options, reopen=pick)
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
    study, storage = _open_study(key, options, workload.neighbour_mb)
    with _study_storage_errors(options.storage_url, storage=storage):
        _search(
            study, storage, search, backend, sessions, options, warm if pick and options.warm_start else [], on_progress
        )
        ranked = _ranked_configs(study) if pick else []
    if not pick:
        winner = Winner(reason="helped with the search (another process owns the key)")
    else:
        winner = pick_winner(
            key=key,
            study_id=study_id,
            default=warm[0],
            ranked=ranked,
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
    valid = space.valid_configs(limits, H=key.H, q_len=key.q_len, restrict=restrict, kv_dtype=key.kv_dtype)
    if options.candidates is not None:
        valid = [c for c in valid if c in options.candidates]
        if not valid:
            raise InvalidConfig(
                f"none of the {len(options.candidates)} candidates is valid for H={key.H}, q_len={key.q_len} on "
                f"{limits.name}"
            )
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
        _precompile(backend, [c for c in search.valid if config_signature(c) not in ledger.known], search.workload)
    proposer = Proposer(
        study=study,
        storage=storage,
        search=search,
        ledger=ledger,
        log=TrialLog(sessions, search.study_id),
        reject=lambda params: _refusal(params, backend.limits, search.key, options.candidates),
        warm=[] if grid else unseen(study, _candidates_only(warm, options.candidates), search.choices),
        n_startup=options.tpe.n_startup,
        grid=grid,
        seed=options.seed,
    )
    with Pipeline(backend, search.workload, search.parallel) as pipeline, Heartbeat(study, storage) as beat:
        Loop(
            study=study, search=search, proposer=proposer, pipeline=pipeline, heartbeat=beat, on_progress=on_progress
        ).run()


def _candidates_only(warm: list[KernelConfig], candidates: frozenset[KernelConfig] | None) -> list[KernelConfig]:
    """The warm start within the candidates: one outside them would only be refused as a trial."""
    return warm if candidates is None else [c for c in warm if c in candidates]


def _refusal(
    params: dict[str, int], limits: DeviceLimits, key: ConfigKey, candidates: frozenset[KernelConfig] | None
) -> str | None:
    why = refusal(params, limits, key)
    if why is None and candidates is not None and config_of(params) not in candidates:
        return "not among the candidates"
    return why


def _counts(sessions: sessionmaker[Session], study_id: int, pick: bool) -> dict[str, int]:
    """The owner finishes the study's row and reads its counts; a helper leaves both to it."""
    if not pick:
        return {}
    with session_scope(sessions) as s:
        studies.finish_study(session=s, study_id=study_id)
        row = s.get_one(models.Study, study_id)
        return {"trials": row.n_trials, "ok": row.n_ok, "invalid": row.n_invalid, "failed": row.n_failed}


def _ranked_configs(study: optuna.Study) -> list[KernelConfig]:
    """Distinct configs of the study's measured trials that passed the gate, fastest first."""
    ok = [
        (t.value, t.params)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.user_attrs.get(STATE_ATTR) == OK and t.value is not None
    ]
    return list(dict.fromkeys(config_of(params) for _, params in sorted(ok, key=lambda vp: vp[0])))
