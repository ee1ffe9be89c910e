from __future__ import annotations

import multiprocessing as mp

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.store import best_configs
from verify_tuner.store.session import session_scope

from tests.store.concurrent_writer import write_many

WRITERS, N = 4, 40


def test_four_processes_upsert_without_loss_or_lock_errors(db_url, sessions):
    ctx = mp.get_context("spawn")
    with ctx.Pool(WRITERS) as pool:
        done = pool.starmap(write_many, [(db_url, w, N) for w in range(WRITERS)])  # re-raises a child's error
    assert done == [N] * WRITERS
    with session_scope(sessions) as s:
        rows = best_configs.list_best(session=s)
    own = [r for r in rows if r.key.H == 8]
    assert len(own) == WRITERS * 26  # every (writer, bucket) key present
    for r in own:  # and it holds the last value its writer wrote for that bucket
        last_i = max(i for i in range(N) if i % 26 == r.key.bucket)
        assert r.config == KernelConfig(8 + last_i, 1, 32, 256) and r.median_us == last_i + 1
    shared = [r for r in rows if r.key.H == 16]
    assert len(shared) == 26 and all(1 <= r.config.nsplit <= WRITERS for r in shared)
