"""The data_version counter: every writer bumps it first, in its own transaction, and the
sidecar's cache stamp reads it with the tables' row counts."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import select, update
from sqlalchemy.orm import Session
from verify_tuner.errors import StorageError
from verify_tuner.store.models import BestConfig, DataVersion, Device
from verify_tuner.store.writes import affected


def bump_version(session: Session) -> None:
    """Every write of best configs or devices calls this in its own transaction, before its
    other writes: the sidecar's cache stamp (data_stamp) then changes with every write, whatever
    the rows' timestamps, and every writer takes this row's lock first (one lock order: writers
    on PostgreSQL queue instead of deadlocking)."""
    if not affected(session, update(DataVersion).where(DataVersion.id == 1).values(version=DataVersion.version + 1)):
        raise StorageError("the data_version row is missing: run `tuner db upgrade`")


class Stamp(NamedTuple):
    """What the sidecar's cache compares (a tuple: equal stamps, equal data), with the count of
    stale rows that /metrics reports."""

    version: int
    best: int
    devices: int
    plans: int
    stale: int


def data_stamp(*, session: Session) -> Stamp:
    """Changes with every write of best configs, graph plans, verdicts or devices (the data_version
    counter, bumped in the writer's transaction): the API's cache key."""
    from sqlalchemy import func
    from verify_tuner.store.models import GraphPlan

    # one round trip every re-check: the counts also notice rows removed behind the tuner's back,
    # and reading the tables notices a database that can no longer serve them
    row = session.execute(
        select(
            select(DataVersion.version).where(DataVersion.id == 1).scalar_subquery(),
            select(func.count(BestConfig.id)).scalar_subquery(),
            select(func.count(Device.id)).scalar_subquery(),
            select(func.count(GraphPlan.id)).scalar_subquery(),
            select(func.count(BestConfig.id)).where(BestConfig.verdict == "stale").scalar_subquery(),
        )
    ).one()
    return Stamp(*row)
