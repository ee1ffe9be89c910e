"""Database calls from the event loop, each with a deadline. A driver waiting on a database that
stopped answering (a stalled network path: no statement or keepalive timeout fires) would
otherwise hold its request forever; past the deadline the request gets the outage answer and
the thread is left to finish or fail on its own."""

from __future__ import annotations

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
