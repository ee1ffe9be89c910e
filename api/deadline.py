"""Database calls from the event loop, each with a deadline. A driver waiting on a database that
stopped answering (a stalled network path: no statement or keepalive timeout fires) would
otherwise hold its request forever; past the deadline the request gets the outage answer and
the thread is left to finish or fail on its own. A write is never left to commit on its own:
`write_within` lets it commit only before its deadline."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import anyio
from verify_tuner.errors import StorageError

P = ParamSpec("P")
T = TypeVar("T")


class NoAnswer(StorageError):
    """The database did not answer within the deadline."""


async def within(seconds: float, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    try:
        with anyio.fail_after(seconds):
            return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs), abandon_on_cancel=True)
    except TimeoutError:
        raise NoAnswer(f"the database did not answer within {seconds:g} s") from None


class NotStored(StorageError):
    """A write's deadline passed before it committed: it is rolled back, never committed later."""


class OutcomeUnknown(StorageError):
    """A write's deadline passed while it was committing, and the commit did not end within the grace."""


class CommitGate:
    """Who decides an abandoned write's fate: its request's deadline or its commit, whichever
    comes first. A write thread past its deadline used to commit anyway, after its client had
    been told 503 (a retry then imported twice; a client that gave up believed nothing was
    written). The thread asks `enter_commit` just before committing; the request, at its
    deadline, `abandon`s the write unless the commit has begun."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = "running"

    def enter_commit(self) -> None:
        """Called by the write thread right before it commits; NotStored (its scope rolls back) once abandoned."""
        with self._lock:
            if self._state == "abandoned":
                raise NotStored("abandoned at its deadline")
            self._state = "committing"

    def abandon(self) -> bool:
        """At the deadline: True when the write can no longer commit, False when its commit has begun."""
        with self._lock:
            if self._state == "committing":
                return False
            self._state = "abandoned"
            return True


async def write_within(seconds: float, grace_s: float, fn: Callable[[CommitGate], T], what: str = "the write") -> T:
    """Run the write `fn(gate)` in a thread with a deadline, and answer only what is true: its result;
    NotStored when the deadline passed before its commit began (the thread then rolls back, whenever
    it gets there); its result after all when the commit had begun and ends within `grace_s`; else
    OutcomeUnknown. Decided as PostgreSQL decides a statement_timeout: a timed-out write never lands."""
    gate = CommitGate()
    task = asyncio.ensure_future(anyio.to_thread.run_sync(lambda: fn(gate), abandon_on_cancel=True))
    await asyncio.wait({task}, timeout=seconds)
    if not task.done() and gate.abandon():
        task.cancel()
        raise NotStored(
            f"{what} did not finish within {seconds:g} s (the database did not answer in time): "
            "rolled back, nothing stored"
        )
    await asyncio.wait({task}, timeout=grace_s)
    if not task.done():
        task.cancel()
        raise OutcomeUnknown(
            f"{what} was committing at its {seconds:g} s deadline and the commit has not ended: "
            "whether it was stored is unknown (read back before retrying)"
        )
    return task.result()
