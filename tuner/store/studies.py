"""Queries of studies and their trials, keyword-only, each taking the session: a key's study,
the claim of the process that stores its winner, and the trials' record."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select, update
from sqlalchemy.orm import Session
from verify_tuner.keys import ConfigKey
from verify_tuner.store.devices import key_ids
from verify_tuner.store.keyed import key_columns
from verify_tuner.store.models import Study, Trial, utcnow
from verify_tuner.store.writes import affected, insert_ignore


def get_or_create_study(
    *,
    session: Session,
    key: ConfigKey,
    prefix: int,
    sampler: str,
    seed: int | None,
    reopen: bool = True,
    neighbour_mb: int = 0,
) -> Study:
    """The study of `key` timed as `neighbour_mb` says, created on first use; a finished one is
    reopened (resume) unless `reopen` is False (a look at its state)."""
    label = key.study_label(neighbour_mb)
    device_id, kernel_id = key_ids(session=session, device=key.device, kernel_hash=key.kernel_hash)
    insert_ignore(
        session,
        Study,
        key_cols={"workload_key": label},
        values={
            **key_columns(device_id, kernel_id, key),
            "neighbour_mb": neighbour_mb,
            "prefix": prefix,
            "status": "running",
            "sampler": sampler,
            "seed": seed,
            "started_at": utcnow(),
            "n_trials": 0,
            "n_ok": 0,
            "n_invalid": 0,
            "n_failed": 0,
        },
    )
    study = session.scalars(select(Study).where(Study.workload_key == label)).one()
    if reopen and study.status != "running":
        study.status, study.finished_at, study.sampler = "running", None, sampler
    return study


def find_study(*, session: Session, key: ConfigKey, neighbour_mb: int = 0) -> Study | None:
    return session.scalars(select(Study).where(Study.workload_key == key.study_label(neighbour_mb))).one_or_none()


def claim_study(*, session: Session, study_id: int, owner: str, stale_before: dt.datetime) -> bool:
    """Make `owner` the process that picks and stores this study's winner, unless another owner
    beat after `stale_before` (one atomic UPDATE: two processes never both win a claim)."""
    stmt = (
        update(Study)
        .where(Study.id == study_id)
        .where((Study.owner.is_(None)) | (Study.owner == owner) | (Study.heartbeat_at < stale_before))
        .values(owner=owner, heartbeat_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return affected(session, stmt) == 1


def beat_study(*, session: Session, study_id: int, owner: str) -> bool:
    """Refresh the claim; False when another process has taken it over (we were stale)."""
    stmt = (
        update(Study)
        .where(Study.id == study_id, Study.owner == owner)
        .values(heartbeat_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return affected(session, stmt) == 1


def owners_of(*, session: Session, workload_keys: list[str]) -> dict[str, str | None]:
    """The owner of each of these keys' studies (None: unowned); keys with no study are left out."""
    rows = session.execute(select(Study.workload_key, Study.owner).where(Study.workload_key.in_(workload_keys)))
    return {k: o for k, o in rows}


def release_study(*, session: Session, study_id: int, owner: str) -> None:
    session.execute(
        update(Study)
        .where(Study.id == study_id, Study.owner == owner)
        .values(owner=None)
        .execution_options(synchronize_session=False)
    )


def record_trial(
    *,
    session: Session,
    study_id: int,
    params: dict[str, int],
    state: str,
    reason: str | None = None,
    median_us: float | None = None,
    p10_us: float | None = None,
    p90_us: float | None = None,
    samples: list[float] | None = None,
    rel_error: float | None = None,
) -> Trial:
    trial = Trial(
        study_id=study_id,
        params=params,
        state=state,
        reason=reason,
        median_us=median_us,
        p10_us=p10_us,
        p90_us=p90_us,
        samples=samples,
        rel_error=rel_error,
    )
    session.add(trial)
    # one atomic UPDATE (not read-modify-write in Python): processes sharing a study lose no count
    session.execute(
        update(Study)
        .where(Study.id == study_id)
        .values(
            n_trials=Study.n_trials + 1,
            n_ok=Study.n_ok + int(state == "ok"),
            n_invalid=Study.n_invalid + int(state == "invalid"),
            n_failed=Study.n_failed + int(state not in ("ok", "invalid")),
        )
    )
    return trial


def list_trials(*, session: Session, study_id: int) -> list[Trial]:
    return list(session.scalars(select(Trial).where(Trial.study_id == study_id).order_by(Trial.id)))


def finish_study(*, session: Session, study_id: int, status: str = "finished") -> None:
    study = session.get(Study, study_id)
    if study is not None:
        study.status, study.finished_at = status, utcnow()
