"""Issue 15's table job (bench/run_multi_table.sh: H=8 q_len=9, 10 prefix buckets, a fixed trial
budget per key) on one process vs several, with every part of the tuner real except the GPU and
nvcc: a measuring child that starts in START_S, "compiles" a config in COMPILE_S (once, under the
compile cache's file lock, as verify_tuner.kernels.build does) and measures in MEASURE_S. It shows what the
tuner itself costs when several processes share one job -- proposing, storage, claims -- on any
machine, where the GPU run (run_multi_table.sh) shows the total on the real one.

    python bench/table_emulation.py --out OUT --trials 20 --procs 2
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import fcntl
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

COMPILE_S = float(os.environ.get("EMU_COMPILE_S", "2.5"))
MEASURE_S = float(os.environ.get("EMU_MEASURE_S", "0.05"))
START_S = float(os.environ.get("EMU_START_S", "2.0"))


def _cost_us(cfg, wl) -> float:  # type: ignore[no-untyped-def]
    """A smooth analytic landscape (it exists to time the search, not to model a kernel)."""
    import math

    c = 20 + 6 * abs(math.log2(cfg.nsplit / 64)) + 3 * abs(math.log2(cfg.ht / min(8, wl.H)))
    c += 2 * abs(math.log2(cfg.tk / 32)) + 2 * abs(math.log2(cfg.block / 256)) + cfg.stages + cfg.wk
    return c * (1 + wl.prefix / 100_000)


class Emulated:
    """The measuring child's stand-in (verify_tuner.measure.gpu_backend loads it by name in each process)."""

    def __init__(self) -> None:
        from verify_tuner.kernels.limits import known_device

        time.sleep(START_S)  # torch, the CUDA context, the bandwidth probe
        self.limits = known_device("h200")

    @staticmethod
    def probe_limits():  # type: ignore[no-untyped-def]
        from verify_tuner.kernels.limits import known_device

        return known_device("h200")

    @staticmethod
    def build(cfg, q_len, arch, **_) -> None:  # type: ignore[no-untyped-def]
        cache = Path(os.environ["EMU_CACHE_DIR"])
        stem = "_".join(f"{k}{v}" for k, v in cfg.as_params().items()) + f"_q{q_len}_{arch}"
        target = cache / f"{stem}.cubin"
        if target.exists():
            return
        with open(cache / f"{stem}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():
                time.sleep(COMPILE_S)
                target.write_text(f"{time.time()}")

    def measure(self, cfg, wl):  # type: ignore[no-untyped-def]
        from verify_tuner.measure.backend import OK, Measurement

        self.build(cfg, wl.q_len, self.limits.arch)
        time.sleep(MEASURE_S)
        us = _cost_us(cfg, wl)
        return Measurement(OK, us, us * 0.99, us * 1.01, [us] * 5, rel_error=0.0)

    def remeasure(self, cfgs, wl, rounds):  # type: ignore[no-untyped-def]
        return [self.measure(c, wl) for c in cfgs]


def _run(mode: str, procs: int, trials: int, prefix_range: str, root: Path) -> dict:
    import optuna
    from sqlalchemy import create_engine, text
    from verify_tuner.cli.study_options import tune_job
    from verify_tuner.jobs.runner import tune_on_device, tune_on_devices
    from verify_tuner.search.study_storage import prepare_study_storage
    from verify_tuner.settings import Settings
    from verify_tuner.store import migrate
    from verify_tuner.study_files import study_urls

    url = f"sqlite:///{root}/{mode}.db"
    cache = root / f"cache-{mode}"
    cache.mkdir()
    os.environ["EMU_CACHE_DIR"] = str(cache)
    migrate.upgrade(url)
    options = {
        "H": 8,
        "q_len": 9,
        "kv_dtype": "bf16",
        "prefix": (),
        "prefix_range": prefix_range,
        "batch_text": "1",
        "spread": "uniform",
        "only": ("STAGES=2,3", "QT=0"),
        "trials": trials,
        "sampler": "tpe",
        "seed": 0,
        "timeout": None,
        "storage": None,
        "measure_timeout": 120.0,
        "compile_jobs": 8,
        "neighbour_mb": 0,
    }
    job = tune_job(options, n_devices=procs)
    job = type(job)(**{**vars(job), "measurer": "bench.table_emulation:Emulated"})
    settings = Settings(database_url=url, cache_dir=cache)
    prepare_study_storage(settings.studies)  # as `tuner db upgrade`
    t0 = time.time()
    if procs == 1:
        tune_on_device(settings, job, 0)
    else:
        res = tune_on_devices(settings, job, list(range(procs)))
        bad = [r for r in res if not r.ok]
        if bad:
            raise RuntimeError(f"a process failed: {bad}")
    wall = time.time() - t0
    per_key, measured, dups = [], 0, 0
    studies = [
        (u, s.study_name)
        for u in study_urls(settings.studies)  # a file per key (the default)
        for s in optuna.get_all_study_summaries(storage=u)
    ]
    for storage, name in studies:
        st = optuna.load_study(study_name=name, storage=storage)
        m = [t for t in st.trials if t.user_attrs.get("measured")]
        measured += len(m)
        dups += sum(n - 1 for n in collections.Counter(tuple(sorted(t.params.items())) for t in m).values())
        spans = [
            (t.datetime_start.timestamp() - t0, t.datetime_complete.timestamp() - t0)
            for t in st.trials
            if t.datetime_start and t.datetime_complete
        ]
        per_key.append(
            {
                "study": name,
                "trials": len(st.trials),
                "measured": len(m),
                "span_s": [round(min(a for a, _ in spans), 2), round(max(b for _, b in spans), 2)],
            }
        )
    with create_engine(url).connect() as c:
        winners = sorted(
            set(dict(c.execute(text("select bucket, count(*) from best_configs group by bucket")).all()).values())
        )
    return {
        "mode": mode,
        "procs": procs,
        "wall_s": round(wall, 2),
        "measured": measured,
        "duplicates": dups,
        "winners_per_key": winners,
        "compiles": len(list(cache.glob("*.cubin"))),
        "per_key": per_key,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--prefix-range", default="1500:45000", help="as run_multi_table.sh: 10 keys")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--tag", default="table_emulation")
    args = ap.parse_args()
    rows = []
    for r in range(args.repeat):
        for procs in (1, args.procs):
            with tempfile.TemporaryDirectory() as tmp:
                res = _run(f"p{procs}", procs, args.trials, args.prefix_range, Path(tmp))
            rows.append(res)
            print(
                f"round {r} procs {procs}: wall {res['wall_s']:.1f} s measured {res['measured']} "
                f"duplicates {res['duplicates']} winners/key {res['winners_per_key']} compiles {res['compiles']}",
                flush=True,
            )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {
            "date": dt.date.today().isoformat(),
            "host_cores": os.cpu_count(),
            "compile_s": COMPILE_S,
            "measure_s": MEASURE_S,
            "start_s": START_S,
            "trials": args.trials,
            "prefix_range": args.prefix_range,
        }
        (args.out / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
