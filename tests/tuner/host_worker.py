"""One `tuner study start`-like process of the two-host test (CPU measurer from tests.fakes)."""

from __future__ import annotations


def run(url: str, cache_dir: str) -> list[str]:
    import optuna
    from verify_tuner.jobs.runner import tune_on_device
    from verify_tuner.measure.backend import Workload
    from verify_tuner.settings import Settings

    from tests.tuner.test_multi_device import _job

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    settings = Settings(database_url=url, cache_dir=cache_dir)
    res = tune_on_device(settings, _job([Workload(8, 9, p) for p in (2048, 4096, 8192, 16384, 32768, 65536)], 6), 0)
    return [str(o.key) for o in res.outcomes]
