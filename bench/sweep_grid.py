"""Sweep of one key's valid configs on the local GPU: compiled in parallel, then gated and timed
one at a time by the tuner's own measurer in its restartable child (a crashing config fails
only itself). Writes JSON for bench/tpe_efficiency.py, which replays the tuner's search against
these measurements.

    python3 bench/sweep_grid.py --H 8 --q-len 9 --prefix 46000 --sample 1500 --compile-only h200
    python3 bench/sweep_grid.py --H 8 --q-len 9 --prefix 46000 --sample 1500 --out $OUT
    python3 bench/sweep_grid.py --H 8 --q-len 9 --prefix 70000 --batch 32 \
        --configs $OUT/sweep_H8_q9_p46000_b1_sm_90.json --out $OUT     # the same configs, another key

Kernel v2's space has tens of thousands of valid configs per key: --sample N measures N of them,
drawn so that every value of every constant appears (the heuristic default is always in), or
--only narrows the space as `tuner study start --only` does. The JSON is rewritten every
--checkpoint configs, and --resume FILE measures only what FILE has not (a device call that ran
out of time loses nothing).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig


def stratified_sample(valid: list[KernelConfig], n: int, seed: int, always: KernelConfig) -> list[KernelConfig]:
    """`n` configs (fewer if the space is smaller) in which every value of every constant that a
    valid config takes appears at least min(3, its count) times, plus `always`."""
    rng = random.Random(seed)
    picked = dict.fromkeys([always] if always in valid else [])
    params = [c.as_params() for c in valid]
    for name in PARAM_NAMES:
        by_value: dict[int, list[KernelConfig]] = {}
        for c, p in zip(valid, params, strict=True):
            by_value.setdefault(p[name], []).append(c)
        for members in by_value.values():
            for c in rng.sample(members, min(3, len(members))):
                picked.setdefault(c)
    rest = [c for c in valid if c not in picked]
    picked.update(dict.fromkeys(rng.sample(rest, max(0, min(len(rest), n - len(picked))))))
    return list(picked)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--q-len", type=int, default=9)
    ap.add_argument("--prefix", type=int, default=46000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--spread", default="uniform")
    ap.add_argument("--sample", type=int, default=None, help="measure this many configs (stratified)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", type=Path, default=None, help="measure the configs of this earlier sweep JSON")
    ap.add_argument("--resume", type=Path, default=None, help="keep this sweep JSON's rows, measure the rest")
    ap.add_argument("--checkpoint", type=int, default=100)
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/va-cache"))
    ap.add_argument("--only", action="append", default=[], metavar="NAME=V1,V2", help="(repeatable)")
    ap.add_argument(
        "--compile-only",
        metavar="DEVICE",
        default=None,
        help="fill the cache for DEVICE's limits (a known GPU name) and exit: no GPU needed, so the "
        "compiles can run beside other work on the device",
    )
    args = ap.parse_args()
    restrict = {k.upper(): [int(v) for v in vals.split(",")] for k, vals in (o.split("=", 1) for o in args.only)}

    from verify_tuner import space
    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.kernels.build import precompile
    from verify_tuner.measure.backend import Workload
    from verify_tuner.measure.gpu_backend import IsolatedBackend

    if args.compile_only:
        from verify_tuner.kernels.limits import known_device

        limits = known_device(args.compile_only)
        if limits is None:
            raise SystemExit(f"unknown device {args.compile_only!r}")
    else:
        backend = IsolatedBackend(measurer_kwargs={"cache_dir": str(args.cache), "reps": 30})
        limits = backend.limits
    valid = space.valid_configs(limits, H=args.H, q_len=args.q_len, restrict=restrict)
    default = heuristic_config(limits, H=args.H, q_len=args.q_len, prefix=args.prefix, batch=args.batch)
    if args.configs:
        configs = [config_of(r) for r in json.loads(args.configs.read_text())["rows"]]
    elif args.sample:
        configs = stratified_sample(valid, args.sample, args.seed, default)
    else:
        configs = valid
    rows = json.loads(args.resume.read_text())["rows"] if args.resume else []
    done = {config_of(r) for r in rows}
    todo = [c for c in configs if c not in done]
    t0 = time.perf_counter()
    failures = precompile(todo, args.q_len, limits.arch, args.cache)
    t_compile = time.perf_counter() - t0
    print(f"compiled {len(todo)} configs in {t_compile:.0f} s ({len(failures)} failed)", flush=True)
    if args.compile_only:  # the list itself, for the measuring run's --configs (the same draw on any machine)
        listed = args.out / f"sweep_H{args.H}_q{args.q_len}_configs_{limits.arch}.json"
        args.out.mkdir(parents=True, exist_ok=True)
        listed.write_text(json.dumps({"rows": [c.as_params() for c in configs], "failed": failures}, indent=0))
        print(f"wrote {listed}")
        return
    wl = Workload(args.H, args.q_len, args.prefix, batch=args.batch, spread=args.spread)
    meta = {
        "device": limits.name,
        "arch": limits.arch,
        "date": dt.date.today().isoformat(),
        "H": args.H,
        "q_len": args.q_len,
        "prefix": args.prefix,
        "batch": args.batch,
        "spread": args.spread,
        "prefix_lens": wl.prefix_lens(),
        "n_valid": len(valid),
        "sampled": len(configs) < len(valid),
        "default": default.as_params(),
        "compile_s": t_compile,
    }
    path = args.out / f"sweep_H{args.H}_q{args.q_len}_p{args.prefix}_b{args.batch}_{limits.arch}.json"
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        for i, cfg in enumerate(todo, 1):
            r = backend.measure(cfg, wl)
            rows.append({**cfg.as_params(), "state": r.state, "median_us": r.median_us, "p10_us": r.p10_us,
                         "p90_us": r.p90_us, "reason": r.reason})  # fmt: skip
            if i % args.checkpoint == 0:
                write(path, meta, rows, time.perf_counter() - t0)
                print(f"measured {i}/{len(todo)}", flush=True)
    finally:
        write(path, meta, rows, time.perf_counter() - t0)
        backend.close()
    ok = [r for r in rows if r["state"] == "ok"]
    if not ok:
        raise SystemExit(f"{len(rows)} rows, none passed the gate; wrote {path}")
    best = min(ok, key=lambda r: r["median_us"])
    print(f"{len(rows)} rows, {len(ok)} ok, best {best['median_us']:.1f} us {config_of(best)}; wrote {path}")


def config_of(row: dict) -> KernelConfig:
    return KernelConfig.from_params({k: row[k] for k in PARAM_NAMES})


def write(path: Path, meta: dict, rows: list[dict], measure_s: float) -> None:
    from verify_tuner.files import write_shared

    write_shared(path, json.dumps({**meta, "measure_s": measure_s, "n_rows": len(rows), "rows": rows}, indent=0))


if __name__ == "__main__":
    main()
