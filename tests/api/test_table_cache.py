"""The sidecar's table cache as a worker fleet meets it: many requests missing the same table at
once (every worker fetches its tables at startup) build it once, not once per request."""

from __future__ import annotations

import threading
import time

from verify_tuner.api import table_cache
from verify_tuner.api.key_query import KeyQuery
from verify_tuner.api.table_cache import TableCache
from verify_tuner.kernels import kernel_hash

QUERY = KeyQuery((("device", "h200"), ("kernel_hash", kernel_hash()), ("kv_dtype", "bf16"), ("H", 8), ("q_len", 9)))


def test_concurrent_misses_of_one_table_read_the_database_once(sessions, monkeypatch):
    real_table = table_cache.lookup.table
    builds = []

    def slow_table(**kw):  # type: ignore[no-untyped-def]
        builds.append(kw["batch_buckets"])
        time.sleep(0.3)  # a build long enough that every other request arrives while it runs
        return real_table(**kw)

    monkeypatch.setattr(table_cache.lookup, "table", slow_table)
    cache = TableCache()
    results: list[tuple[object, bool]] = []

    def request() -> None:
        results.append(cache.table(sessions, QUERY, 3))

    threads = [threading.Thread(target=request) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16 and len(builds) == 1, builds
    assert sum(read for _, read in results) == 1  # the metric counts one database read
    assert len({id(t) for t, _ in results}) == 1  # every request got the one table
    # another key builds on its own
    cache.table(sessions, QUERY, 4)
    assert len(builds) == 2
