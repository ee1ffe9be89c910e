"""Exhaustive sweep of the valid grid for one key on the local GPU (every config compiled in
parallel, then gated and timed by the tuner's own measurer). Writes JSON for
bench/tpe_efficiency.py, which replays Optuna's TPE against these measurements.

    python3 bench/sweep_grid.py --H 8 --q-len 9 --prefix 46000 --only STAGES=2 --only PIPE=1 --out $OUT

Kernel v2's space has tens of thousands of valid configs per key: narrow it with --only (the
same NAME=v1,v2 form as `tuner study start --only`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--q-len", type=int, default=9)
    ap.add_argument("--prefix", type=int, default=46000)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--cache", type=Path, default=Path("/tmp/va-cache"))
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="keep only these values of a constant (repeatable)",
    )
    args = ap.parse_args()
    restrict = {k.upper(): [int(v) for v in vals.split(",")] for k, vals in (o.split("=", 1) for o in args.only)}

    from verify_tuner import space
    from verify_tuner.kernels.build import precompile
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.measure.backend import Workload
    from verify_tuner.measure.gpu import GpuMeasurer

    limits = read_device_limits(0)
    valid = space.valid_configs(limits, H=args.H, q_len=args.q_len, restrict=restrict)
    t0 = time.perf_counter()
    failures = precompile(valid, args.q_len, limits.arch, args.cache)
    t_compile = time.perf_counter() - t0
    print(f"compiled {len(valid)} configs in {t_compile:.0f} s ({len(failures)} failed)", flush=True)
    m = GpuMeasurer(cache_dir=str(args.cache), reps=30)
    wl = Workload(args.H, args.q_len, args.prefix)
    rows = []
    t0 = time.perf_counter()
    for cfg in valid:
        r = m.measure(cfg, wl)
        rows.append(
            {
                **cfg.as_params(),
                "state": r.state,
                "median_us": r.median_us,
                "p10_us": r.p10_us,
                "p90_us": r.p90_us,
                "reason": r.reason,
            }
        )
    t_measure = time.perf_counter() - t0
    ok = [r for r in rows if r["state"] == "ok"]
    best = min(ok, key=lambda r: r["median_us"])
    print(f"measured {len(rows)} in {t_measure:.0f} s: {len(ok)} ok, best {best}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"sweep_H{args.H}_q{args.q_len}_p{args.prefix}_{limits.arch}.json"
    (args.out / name).write_text(
        json.dumps(
            {
                "device": limits.name,
                "arch": limits.arch,
                "date": dt.date.today().isoformat(),
                "H": args.H,
                "q_len": args.q_len,
                "prefix": args.prefix,
                "n_valid": len(valid),
                "compile_s": t_compile,
                "measure_s": t_measure,
                "rows": rows,
            },
            indent=0,
        )
    )


if __name__ == "__main__":
    main()
