"""Child-process body for the concurrency test (spawned, so it must live in an importable module)."""

from __future__ import annotations

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.keys import ConfigKey
from verify_tuner.store import best_configs, devices
from verify_tuner.store.session import make_engine, session_factory, session_scope


def write_many(url: str, worker: int, n: int) -> int:
    sessions = session_factory(make_engine(url))
    h200 = known_device("h200")
    for i in range(n):
        with session_scope(sessions) as s:
            devices.upsert_device(session=s, limits=h200)  # every writer touches the same row too
            own = ConfigKey(h200.name, "k" * 16, "bf16", 8, 1 + worker, i % 26)
            best_configs.upsert_best(
                session=s, row=best_configs.BestRow(own, KernelConfig(8 + i, 1, 32, 256), median_us=float(i + 1))
            )
            shared = ConfigKey(h200.name, "k" * 16, "bf16", 16, 9, i % 26)
            best_configs.upsert_best(
                session=s, row=best_configs.BestRow(shared, KernelConfig(worker + 1, 1, 32, 256), median_us=1.0)
            )
    return n
