"""Lookups behind the routes, with a cache that keeps serving the last good table when the
database fails (with the reason in a header). A background check reads a stamp that every write
changes (data_version.data_stamp) and the request path compares against the last stamp it read: no
request waits on the database unless its table is missing or the data changed."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field, replace

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from verify_tuner import buckets
from verify_tuner.api.key_query import KeyQuery
from verify_tuner.api.schemas import ConfigEntryOut, GraphPlanOut
from verify_tuner.errors import StorageError
from verify_tuner.kernels import kernel_hash as current_kernel_hash
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.keys import TableKey
from verify_tuner.store import best_configs, data_version, lookup, plan_docs, plans
from verify_tuner.store.session import session_scope


@dataclass(frozen=True)
class Table:
    """One batch bucket of an answer table (verify_tuner.keys.TableKey), with each prefix bucket's
    JSON body rendered once: a lookup is then a bisect and a bytes copy, not a model build and
    serialisation."""

    stamp: tuple[object, ...]
    limits: DeviceLimits
    key: TableKey  # the device by its recorded name
    answers: list[lookup.Answer]
    bodies: tuple[bytes, ...] = field(default=())
    stale: str | None = None  # why the database could not be read, when serving from cache
    #: why there is no table (a kernel hash the database holds no configs of): the routes' 404
    missing: str | None = None
    #: the ranges of the batch bucket's graph plan set, each rendered (GraphPlanOut), in prefix order
    plans: tuple[bytes, ...] = ()
    #: where the set's ranges after the first start (prefix tokens)
    breakpoints: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.bodies:
            bodies = tuple(ConfigEntryOut.of(a).model_dump_json().encode() for a in self.answers)
            object.__setattr__(self, "bodies", bodies)

    def pick(self, prefix: int) -> tuple[lookup.Answer, bytes]:
        """The answer and /config's body: the /configs entry with the range of the batch bucket's graph
        plan set that holds the prefix."""
        i = buckets.bucket_of(prefix).index
        plan = self.plans[bisect.bisect_right(self.breakpoints, prefix)] if self.plans else b"null"
        return self.answers[i], self.bodies[i][:-1] + b',"graph_plan":' + plan + b"}"


class TableCache:
    """Per-key tables, validated against the database by one background check every
    `recheck_s` (a single cheap query for all keys), so the request path does no I/O while
    nothing changed. A check that runs late (a saturated event loop) never sends requests to the
    database: they keep the table of the last stamp read, and the check catches up off the
    request path. Writes through this process's API clear it at once. While the background
    check fails, requests get the last good table at once, marked stale with the reason (or a
    503 for a key never served) instead of each waiting on the failing database."""

    #: Builds of one key are single-flight: concurrent misses (a worker fleet starting at once asks
    #: for the same 13 tables) wait for the one build instead of each reading the database. Keys
    #: share BUILD_STRIPES locks by hash, so the locks stay bounded.
    BUILD_STRIPES = 64

    def __init__(self, max_entries: int = 4096, recheck_s: float = 0.1) -> None:
        self._lock = threading.Lock()
        self._build_locks = [threading.Lock() for _ in range(self.BUILD_STRIPES)]
        self._tables: dict[tuple[KeyQuery, int], Table] = {}
        self.max_entries, self.recheck_s = max_entries, recheck_s
        self._stamp: tuple[object, ...] | None = None
        self._failure: str | None = None  # why the last background check failed
        #: the kernel this sidecar launches: answered with the heuristic where nothing is tuned
        self.own_kernel = current_kernel_hash()

    def fresh(self, query: KeyQuery, batch_bucket: int = 0) -> Table | None:
        """The cached table when it was built at the stamp the last background check read, or,
        while the check fails, the last good table marked stale; None (no table yet, or the data
        changed) sends the caller to `table` (threadpool, database). StorageError: the database
        is failing and this key has no good table."""
        with self._lock:
            hit, failure = self._tables.get((query, batch_bucket)), self._failure
            if failure is not None:
                if hit is None:
                    raise StorageError(failure)
                return replace(hit, stale=failure)
            if hit is not None and hit.stale is None and hit.stamp == self._stamp:
                return hit
        return None

    @property
    def failure(self) -> str | None:
        """Why the last background check failed (None: it read the stamp)."""
        with self._lock:
            return self._failure

    def revalidate(self, sessions: sessionmaker[Session]) -> bool:
        """The background check: read the stamp (True), or record why it could not be read."""
        try:
            with session_scope(sessions) as session:
                stamp = data_version.data_stamp(session=session)
        except (SQLAlchemyError, StorageError) as exc:
            with self._lock:
                self._stamp, self._failure = None, str(exc).splitlines()[0][:300]
            return False
        with self._lock:
            self._stamp, self._failure = stamp, None
        return True

    def fail(self, reason: str) -> None:
        """The database stopped answering (the caller's deadline passed): serve as in an outage
        until a background check reads the stamp again."""
        with self._lock:
            self._stamp, self._failure = None, reason

    def clear(self) -> None:
        """After a write through this process: the tables are out of date, and the database answered."""
        with self._lock:
            self._tables.clear()
            self._stamp, self._failure = None, None

    def table(self, sessions: sessionmaker[Session], query: KeyQuery, batch_bucket: int = 0) -> tuple[Table, bool]:
        """The table of `query` (its local fields filled in: with_local) and whether this call read the
        database: False when another request built it while this one waited for the key's build lock."""
        cached = (query, batch_bucket)
        with self._build_locks[hash(cached) % self.BUILD_STRIPES]:
            with self._lock:
                hit = self._tables.get(cached)
                if hit is not None and self._failure is None and hit.stamp == self._stamp:
                    return hit, False  # built meanwhile at the stamp last read
            return self._build(sessions, query, batch_bucket), True

    def _build(self, sessions: sessionmaker[Session], query: KeyQuery, batch_bucket: int) -> Table:
        cached = (query, batch_bucket)
        try:
            with session_scope(sessions) as session:
                stamp = data_version.data_stamp(session=session)
                with self._lock:
                    hit = self._tables.get(cached)
                if hit is not None and hit.stamp == stamp:
                    return hit
                table = self._read(session, stamp, query, batch_bucket)
        except (SQLAlchemyError, StorageError) as exc:
            with self._lock:
                hit = self._tables.get(cached)
            if hit is None:
                raise StorageError(str(exc).splitlines()[0]) from exc
            return replace(hit, stale=str(exc).splitlines()[0][:300])
        with self._lock:
            if len(self._tables) >= self.max_entries:
                self._tables.clear()
            self._tables[cached] = table
            self._stamp = stamp
        return table

    def _read(self, session: Session, stamp: tuple[object, ...], query: KeyQuery, batch_bucket: int) -> Table:
        """The table from the database: the device named resolved (an alias, or the only recorded one)."""
        limits = lookup.resolve_device(session=session, name=query.get("device"), default=None)
        key = query.key(device=limits.name)
        missing = self._missing(session, key.kernel_hash, limits.name)
        if missing:
            return Table(stamp, limits, key, [], missing=missing)
        answers = lookup.table(session=session, limits=limits, key=key, batch_buckets=[batch_bucket])
        chosen = plans.served_sets(session=session, table=key).get(batch_bucket)
        if chosen is None:
            return Table(stamp, limits, key, answers)
        bodies = tuple(GraphPlanOut.model_validate(d).model_dump_json().encode() for d in plan_docs.range_docs(chosen))
        return Table(stamp, limits, key, answers, plans=bodies, breakpoints=chosen.breakpoints)

    @property
    def stale_rows(self) -> int | None:
        """Stored bests marked stale, as of the last stamp read (None before the first)."""
        with self._lock:
            stamp = self._stamp
        return getattr(stamp, "stale", None)

    def _missing(self, session: Session, kernel_hash: str, device: str) -> str | None:
        """Why `kernel_hash` has no table on `device`, or None: this sidecar's own kernel always
        has one (the heuristic fills what is not tuned), another only where configs were stored."""
        if kernel_hash == self.own_kernel:
            return None
        held = best_configs.kernels_with_best(session=session, device=device)
        if kernel_hash in held:
            return None
        others = [k for k in held if k != self.own_kernel]
        return (
            f"no configs for kernel_hash {kernel_hash!r} on {device}: this sidecar answers for its own kernel "
            f"{self.own_kernel}" + (f" and holds tuned configs of {', '.join(others)}" if others else "")
        )
