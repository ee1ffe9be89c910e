"""Opening a study's Optuna storage: one shared RDB storage, or an SQLite file per key created on
first open as a copy of a blank one (verify_tuner.study_files names them); `tuner db upgrade`
prepares either up front (prepare_study_storage). With a heartbeat, a killed process's running
trials are failed and retried by whoever opens the study next."""

from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
from verify_tuner.store.session import CONNECT_TIMEOUT_S, make_engine
from verify_tuner.study_files import STUDY, study_file_url

#: Optuna's heartbeat: a trial whose process stops beating for HEARTBEAT_GRACE x this (kill -9, a
#: lost host) is failed by the next process that opens the study and retried with its params.
HEARTBEAT_S = 10.0
HEARTBEAT_GRACE = 3
#: The variable an unwritable study storage is blamed on (the config database's is TUNER_DATABASE_URL).
STUDY_SETTING = "TUNER_STUDY_STORAGE"


def _sqlite_trials(storage: optuna.storages.RDBStorage) -> None:
    """Optuna's own connections to an SQLite file: transactions that take the write lock at BEGIN,
    and commits without an fsync.

    Optuna moves a queued trial to RUNNING by reading it `FOR UPDATE` and then writing; SQLite
    ignores FOR UPDATE, so two processes asking at once (or one asking while another withdraws
    what it queued) both read it WAITING and both take it. BEGIN IMMEDIATE serializes the two as
    PostgreSQL's row lock does. A study's transactions are short, and its processes few.

    synchronous=NORMAL: in WAL mode a commit then skips its fsync (the WAL is synced at checkpoints
    and by the next FULL commit), which survives a killed process but may lose the last trials to
    a power cut -- they are re-run on resume. Trials are ~10 commits each, the bulk of a key's
    writes; the config database's own writes (best configs, claims:
    verify_tuner.store.session.make_engine) keep FULL."""
    from sqlalchemy import event

    @event.listens_for(storage.engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # pysqlite's own BEGIN is deferred: we issue ours, below
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    @event.listens_for(storage.engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

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
    with migrate.upgrade_lock(url, STUDY_SETTING):  # creates the file empty; no connection has a transaction open on it
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
        with migrate.upgrade_lock(url, STUDY_SETTING):  # Optuna creates its tables on first open: one at a time
            open_storage(url)
        return
    from sqlalchemy.engine import make_url
    from verify_tuner.store.session import check_writable

    path = Path(make_url(url).database).expanduser()  # type: ignore[arg-type]
    check_writable(path, STUDY_SETTING)  # creates the directory, or says how to make it writable
    _blank_study_file(path.parent)


def _blank_study_file(directory: Path) -> Path:
    """An SQLite file holding Optuna's empty schema (this Optuna version's, in WAL mode, nothing in
    its -wal), made once per directory: Optuna creating its schema loads its alembic revisions to
    stamp the version, far slower than copying a file, and a one-GPU table would pay it every key."""
    blank = directory / f".blank-optuna-{optuna.__version__}.db"
    url = f"sqlite:///{blank}"
    from verify_tuner.store import migrate

    with migrate.upgrade_lock(url, STUDY_SETTING):
        if blank.stat().st_size == 0:
            storage = open_storage(url)
            raw = storage.engine.raw_connection()  # outside a transaction: a checkpoint inside one cannot truncate
            try:
                raw.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # type: ignore[union-attr]
            finally:
                raw.close()
            storage.engine.dispose()
    return blank


def open_storage(url: str, heartbeat_s: float | None = None) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage at `url`, creating its schema if needed; with `heartbeat_s`, running
    trials beat and stale ones are failed and retried (RetryHeartbeatStaleTrialCallback).

    `tuner db upgrade` calls this up front; the retry covers workers that start together on a
    fresh separate storage and race to create the same tables."""
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    if url.startswith("sqlite"):  # journal_mode=WAL is stored in the file: set it once, on a connection
        engine = make_engine(url, wal=True, setting=STUDY_SETTING)  # (Optuna's engine does not)
        with engine.connect():
            pass
        engine.dispose()
        kwargs: dict[str, object] = {"connect_args": {"timeout": 60}}
    else:  # bounded like the config database's: a server that accepts and never answers must not hang a study
        kwargs = {"pool_pre_ping": True, "connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    beat: dict[str, Any] = {}
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
                    _sqlite_trials(storage)
                return storage
        except (IntegrityError, ProgrammingError):
            if attempt == 4:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")
