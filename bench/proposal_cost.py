"""What a key's search costs besides measuring: Optuna proposals per measurement, the share of
proposals `validate` rejects, and wall time per key, on the CPU with SQLite -- the part of a
table's tuning that issue 15 found limits its multi-GPU scaling.

The backend answers every config at once from a fixed analytic landscape (it exists to time
the search, not to model a kernel), so the wall time is the tuner's own: proposing, checking,
storing, picking the winner.

    python bench/proposal_cost.py --out OUT [--keys 8 --trials 8,20 --seed 0]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class Instant:
    """Answers a measurement at once from an analytic landscape (smooth in the constants)."""

    def __init__(self, limits) -> None:  # type: ignore[no-untyped-def]
        self.limits = limits
        self.measured = 0

    def _us(self, cfg, wl) -> float:  # type: ignore[no-untyped-def]
        c = 20 + 6 * abs(math.log2(cfg.nsplit / 64)) + 3 * abs(math.log2(cfg.ht / min(8, wl.H)))
        c += 2 * abs(math.log2(cfg.tk / 32)) + 2 * abs(math.log2(cfg.block / 256)) + cfg.stages + cfg.wk
        return c * (1 + wl.prefix / 100_000)

    def measure(self, cfg, wl):  # type: ignore[no-untyped-def]
        from verify_tuner.measure.backend import OK, Measurement

        self.measured += 1
        us = self._us(cfg, wl)
        return Measurement(OK, us, us * 0.99, us * 1.01, [us] * 5, rel_error=0.0)

    def remeasure(self, cfgs, wl, rounds):  # type: ignore[no-untyped-def]
        return [self.measure(c, wl) for c in cfgs]

    def compile_ahead(self, cfg, workload) -> None:  # type: ignore[no-untyped-def]
        pass

    def close(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument("--keys", type=int, default=8, help="prefix buckets of H=8 q=9, from 1024 up")
    ap.add_argument("--trials", default="8,20")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="proposal_cost")
    args = ap.parse_args()

    import optuna
    from sqlalchemy.orm import sessionmaker
    from verify_tuner import buckets
    from verify_tuner.kernels.limits import known_device
    from verify_tuner.measure.backend import Workload
    from verify_tuner.search.study import StudyOptions, run_study
    from verify_tuner.store import migrate
    from verify_tuner.store.session import make_engine

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    limits = known_device("h200")
    prefixes = [b.lo for b in buckets.ALL if b.lo >= 1024][: args.keys]
    rows = []
    for n in (int(x) for x in args.trials.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/configs.db"
            migrate.upgrade(url)
            sessions = sessionmaker(make_engine(url), expire_on_commit=False)
            for prefix in prefixes:
                backend = Instant(limits)
                t0 = time.perf_counter()
                out = run_study(
                    backend=backend,
                    sessions=sessions,
                    options=StudyOptions(storage_url=url, seed=args.seed),
                    workload=Workload(8, 9, prefix),
                    n_trials=n,
                )
                wall = time.perf_counter() - t0
                st = optuna.load_study(study_name=out.key.study_name, storage=url)
                states = [t.user_attrs.get("state") for t in st.trials]
                invalid = sum(s == "invalid" for s in states)
                rows.append(
                    {
                        "trials": n,
                        "prefix": prefix,
                        "proposals": len(st.trials),
                        "invalid": invalid,
                        "measured": sum(bool(t.user_attrs.get("measured")) for t in st.trials),
                        "wall_s": wall,
                    }
                )
                print(
                    f"trials={n:3d} prefix={prefix:7d} proposals={len(st.trials):4d} invalid={invalid:4d} "
                    f"wall={wall:6.2f}s",
                    flush=True,
                )
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.date.today().isoformat()
    (args.out / f"{args.tag}.json").write_text(json.dumps({"date": stamp, "rows": rows}, indent=1))
    lines = [
        f"# Search cost per key without measuring — H=8 q=9, SQLite, this machine, {stamp}",
        "",
        (
            "`python bench/proposal_cost.py`: each key's study against an instant backend (analytic landscape), "
            "so the time is proposing, checking, storing and picking the winner."
        ),
        "",
        "| trials a key | keys | proposals a key | invalid share | wall s a key |",
        "|---|---|---|---|---|",
    ]
    for n in sorted({r["trials"] for r in rows}):
        rs = [r for r in rows if r["trials"] == n]
        props = sum(r["proposals"] for r in rs)
        lines.append(
            f"| {n} | {len(rs)} | {props / len(rs):.1f} | {sum(r['invalid'] for r in rs) / props:.2f} | "
            f"{sum(r['wall_s'] for r in rs) / len(rs):.2f} |"
        )
    (args.out / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
