"""How many TPE trials reach within 3% of the exhaustive sweep's best, and how close is the best
found after 10/20/40/80 measurements? Replays the tuner's own
search (run_study with its TPE settings, warm start and dedupe) against the measured sweep, on
the CPU: the objective answers each config with its measured median from the sweep.

    python bench/tpe_efficiency.py bench/results/sweep_H8_q9_p46000_b1_sm_90.json --seeds 40 --budget 60 [--cold]

A sampled sweep (bench/sweep_grid.py --sample N) is replayed with the search limited to the
sampled configs (StudyOptions.candidates), so every measurement the replay counts is a recorded one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


#: measurement counts at which the best config found so far is compared with the sweep's best
#: (a table job tunes each key with a budget of ~20), and the budget itself
REGRET_AT = (10, 20, 40, 80)


class Replay:
    """A Backend answering from a recorded sweep (used by this analysis only)."""

    def __init__(self, limits, table):  # type: ignore[no-untyped-def]
        self.limits, self.table, self.calls = limits, table, []

    def measure(self, cfg, wl):  # type: ignore[no-untyped-def]
        from verify_tuner.measure.backend import Measurement

        r = self.table.get(cfg)
        self.calls.append(cfg)
        if r is None:  # e.g. a heuristic default outside the recorded space: the winner pick asks for it
            return Measurement("crashed", reason="not in the recorded sweep")
        if r["state"] != "ok":
            return Measurement(r["state"], reason=r["reason"])
        return Measurement("ok", r["median_us"], r["p10_us"], r["p90_us"], [r["median_us"]])

    def remeasure(self, cfgs, wl, rounds):  # type: ignore[no-untyped-def]
        return [self.measure(c, wl) for c in cfgs]

    def compile_ahead(self, cfg, workload) -> None:  # type: ignore[no-untyped-def]
        pass  # nothing to build: the timings are recorded

    def close(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=150)
    ap.add_argument("--out", type=Path, default=None)
    # what-if settings of the tuner's TPE (bench/results/tpe_fit.md); unset: the tuner's own
    ap.add_argument("--n-startup", type=int, default=None, help="finished trials before TPE models them")
    ap.add_argument(
        "--cold",
        action="store_true",
        help="search without the warm start (heuristic default, neighbours' bests): TPE on its own",
    )
    ap.add_argument("--ei-candidates", type=int, default=None, help="candidates TPE draws per proposal")
    args = ap.parse_args()
    from dataclasses import replace

    from verify_tuner.search.study import StudyOptions, TpeSettings

    tpe = TpeSettings()
    if args.n_startup is not None:
        tpe = replace(tpe, n_startup=args.n_startup)
    if args.ei_candidates is not None:
        tpe = replace(tpe, n_ei_candidates=args.ei_candidates)
    import optuna
    from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig
    from verify_tuner.kernels.limits import known_device
    from verify_tuner.measure.backend import Workload
    from verify_tuner.search.study import run_study
    from verify_tuner.store import migrate
    from verify_tuner.store.session import make_engine, session_factory

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    sweep = json.loads(args.sweep.read_text())
    table = {KernelConfig.from_params({k: r[k] for k in PARAM_NAMES if k in r}): r for r in sweep["rows"]}
    best = min(r["median_us"] for r in sweep["rows"] if r["state"] == "ok")
    limits = known_device(sweep["device"]) or known_device("h200")
    marks = sorted({n for n in REGRET_AT if n < args.budget} | {args.budget})
    needed: list[float] = []
    gaps: list[dict[int, float]] = []  # per seed: the best found in the first n measurements / the sweep's best
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        url = f"sqlite:///{tempfile.mkdtemp()}/r.db"
        migrate.upgrade(url)
        rb, seen = Replay(limits, table), []  # seen: the calls made when each measured trial was told
        # the search may only propose what the sweep measured (a sweep of an older, smaller space)
        # a sampled sweep: TPE's proposals outside the sample are refused, its nearest recorded config tried
        listed = frozenset(table) if sweep.get("sampled") else None
        run_study(
            backend=rb,
            sessions=session_factory(make_engine(url)),
            options=StudyOptions(storage_url=url, seed=seed, tpe=tpe, candidates=listed, warm_start=not args.cold),
            workload=Workload(
                sweep["H"],
                sweep["q_len"],
                sweep["prefix"],
                batch=sweep.get("batch", 1),
                spread=sweep.get("spread", "uniform"),
            ),
            n_trials=args.budget,
            restrict={p: sorted({c.as_params()[p] for c in table}) for p in PARAM_NAMES},
            on_progress=lambda _p, rb=rb, seen=seen: seen.append(len(rb.calls)),
        )
        searched = (
            rb.calls[: seen[-1]] if seen else []
        )  # the last progress is the search's end: the winner phase follows
        hit = next(
            (
                i + 1
                for i, c in enumerate(searched)
                if c in table and table[c]["state"] == "ok" and table[c]["median_us"] <= 1.03 * best
            ),
            None,
        )
        needed.append(hit if hit is not None else float("inf"))
        ok = [table[c]["median_us"] if c in table and table[c]["state"] == "ok" else float("inf") for c in searched]
        gaps.append({n: round(min(ok[:n], default=float("inf")) / best, 4) for n in marks})
        print(
            f"seed {seed}: within 3% after {hit} measured trials; best found / sweep best: "
            + ", ".join(f"{gaps[-1][n]:.3f} in {n}" for n in gaps[-1]),
            flush=True,
        )
    finite = [n for n in needed if n != float("inf")]
    summary = {
        "sweep": args.sweep.name,
        "n_valid": sweep["n_valid"],
        "best_us": best,
        "seeds": args.seeds,
        "budget": args.budget,
        "warm_start": not args.cold,
        "trials_to_3pct": needed,
        "median": statistics.median(finite) if finite else None,
        "worst": max(needed),
        "median_fraction_of_grid": (statistics.median(finite) / sweep["n_valid"]) if finite else None,
        "best_over_sweep_best": {
            n: {
                "mean": round(statistics.fmean(g[n] for g in gaps), 4),
                "median": statistics.median(g[n] for g in gaps),
                "worst": max(g[n] for g in gaps),
            }
            for n in marks
        },
    }
    print(json.dumps(summary))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
