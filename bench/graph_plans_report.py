"""The graph plan sets of one table as a results file: what `tuner study graph-plan --json` printed
(bench/run_table_tune.sh saves it), the study's wall times from the same state dir, and a plot of
each batch size's plan (its ranges joined) against every prefix bucket's own best. Each batch
size's graphs, breakpoints and regret over every bucket are checked against the targets (B=1:
regret geomean <= 1.02 and worst <= 1.10 with at most 2 graphs).

    python bench/graph_plans_report.py OUT/graph_plans.json STATE/walltimes.txt \
        --device "NVIDIA H200" --date 2026-12-02 --out OUT

Writes graph_plans_<arch>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig

#: B=1's plan set over 0..131k: (regret geomean, worst regret, graphs) at most
TARGET = (1.02, 1.10, 2)


def config_text(p: dict) -> str:
    return str(KernelConfig.from_params({k: p[k] for k in PARAM_NAMES}))


def as_sets(printed: list[dict]) -> list[dict]:
    """`study graph-plan --json`'s documents as plan sets; one printed before ranges (a plan document
    itself) is a set of one range."""
    out = []
    for d in printed:
        if "ranges" in d:
            out.append(d)
            continue
        out.append({"batch_bucket": d["batch_bucket"], "range_count": 1, "breakpoints": [],
                    "expected_us": d["expected_us"], "regret_geomean": d["regret_geomean"],
                    "regret_worst": d["regret_worst"], "heuristic_expected_us": d["heuristic_expected_us"],
                    "expected_us_by_graphs": [d["expected_us"]], "ranges": [d]})  # fmt: skip
    return out


def buckets_of(plan_set: dict) -> list[dict]:
    """The set's buckets in prefix order, each with its range's config."""
    return [b | {"config": config_text(r)} for r in plan_set["ranges"] for b in r["buckets"]]


def verdict(plan_set: dict) -> str:
    """Whether a B=1 set meets the targets (other batch sizes: no target)."""
    if plan_set["batch_bucket"]["hi"] != 1:
        return ""
    geo, worst, graphs = TARGET
    ok = plan_set["regret_geomean"] <= geo and plan_set["regret_worst"] <= worst and plan_set["range_count"] <= graphs
    return f"{'meets' if ok else 'MISSES'} the target (geomean <= {geo}, worst <= {worst}, <= {graphs} graphs)"


def set_lines(sets: list[dict]) -> list[str]:
    """The summary table: a row per batch size's set, then a row per range."""
    lines = [
        "| batch | graphs | breakpoints | expected µs (1 graph) | heuristic µs | regret geomean | worst | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in sets:
        one = p["expected_us_by_graphs"][0]
        lines.append(
            f"| {p['batch_bucket']['lo']}..{p['batch_bucket']['hi']} | {p['range_count']} | {p['breakpoints']} | "
            f"{p['expected_us']:.1f} ({one:.1f}) | {p['heuristic_expected_us'] or float('nan'):.1f} | "
            f"{p['regret_geomean']:.3f} | {p['regret_worst']:.3f} | {verdict(p)} |"
        )
    lines += ["", "| batch | range | config | regret geomean | worst | worst at prefix |", "|---|---|---|---|---|---|"]
    for p in sets:
        for r in p["ranges"]:
            worst = max(r["buckets"], key=lambda b: b["regret"])
            lines.append(
                f"| {p['batch_bucket']['lo']}..{p['batch_bucket']['hi']} | [{r['prefix_lo']}, {r['prefix_hi']}) | "
                f"{config_text(r)} | {r['regret_geomean']:.3f} | {r['regret_worst']:.3f} | {worst['prefix']} |"
            )
    return lines


def walltimes(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        m = re.fullmatch(r"(\S+) wall (\d+) ms rc=(-?\d+)", line.strip())
        if m:
            out.append({"phase": m[1], "wall_s": int(m[2]) / 1000, "rc": int(m[3])})
    return out


def verifications(url: str) -> dict[str, int]:
    from collections import Counter

    from verify_tuner.store.migrate import checked_sessions
    from verify_tuner.store.plans import list_verifications

    with checked_sessions(url)() as s:
        return dict(Counter(v.verdict for v in list_verifications(session=s)))


def table_rows(url: str) -> tuple[dict[str, int], list[dict]]:
    """The table's trials by state (measured, refused before compiling, ...) and its stored best per
    (batch bucket, prefix bucket) with its config: what the per-bucket regrets are against."""
    from collections import Counter

    from sqlalchemy import select
    from verify_tuner.store import best_configs, models
    from verify_tuner.store.migrate import checked_sessions

    with checked_sessions(url)() as s:
        states = dict(Counter(s.scalars(select(models.Trial.state))))
        bests = [
            {
                "batch_bucket": r.key.batch_bucket,
                "bucket": r.key.bucket,
                "config": str(r.config),
                "median_us": r.median_us,
                "default_us": r.default_us,
            }
            for r in best_configs.list_best(session=s)
        ]
    return states, sorted(bests, key=lambda b: (b["batch_bucket"], b["bucket"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("plans_json", type=Path)
    ap.add_argument("walltimes", type=Path)
    ap.add_argument("--device", required=True)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--date", required=True)
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument("--database-url", default=None, help="The table's database: its `configs verify` verdicts.")
    ap.add_argument(
        "--studies", type=Path, default=None, help="The table's Optuna study files: configs measured at every bucket."
    )
    ap.add_argument("--trials", type=int, default=20, help="the measured trials a key the table was tuned with")
    ap.add_argument("--tag", default="", help="file names graph_plans_TAG_ARCH (a table timed another way)")
    ap.add_argument("--prefixes", default="0..131072", help="the range the table was tuned and planned over")
    args = ap.parse_args()
    plans = as_sets(json.loads(args.plans_json.read_text()))
    walls = walltimes(args.walltimes)
    study_s = sum(w["wall_s"] for w in walls if w["phase"] == "study")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / (f"graph_plans_{args.tag}_{args.arch}" if args.tag else f"graph_plans_{args.arch}")
    nb = {r.get("neighbour_mb", 0) for p in plans for r in p["ranges"]}
    verdicts = verifications(args.database_url) if args.database_url else {}
    states, bests = table_rows(args.database_url) if args.database_url else ({}, [])
    doc = {
        "device": args.device,
        "arch": args.arch,
        "date": args.date,
        "neighbour_mb": sorted(nb),
        "walltimes": walls,
        "verify_verdicts": verdicts,
        "trial_states": states,
        "stored_bests": bests,
        "plans": plans,
    }
    lines = [
        f"# Graph plans — {args.device} ({args.arch}), {args.date}",
        "",
        (
            f"`bash bench/run_table_tune.sh STATE OUT LIMIT {args.trials}` (H=8 q=9, prefixes {args.prefixes}, "
            f"batch 1, 8, 32, {args.trials} measured trials a key, seed 0), run until the study finished, then "
            "`python bench/graph_plans_report.py`. The plans: `tuner study graph-plan --rounds 2 --passes 1 "
            "--max-graphs 2`, every bucket's stored best and the heuristic re-timed side by side at every bucket, "
            "equal weights; a second range only where it saved 2 % of the expected step time."
            + (
                f" Timed cold: `NEIGHBOUR_MB={max(nb)}`, every launch of the study, the plans and the unseen draws "
                f"followed by a bf16 GEMM over {max(nb)} MB of weights, its own time subtracted."
                if any(nb)
                else " Timed back to back (CUDA-graph replays, inputs rotated past the L2)."
            )
        ),
        "",
        f"Study wall time, summed over the calls it took (killed with -9 at each call's limit, resumed from the "
        f"same files): **{study_s:.0f} s** ("
        + " + ".join(f"{w['wall_s']:.0f}" for w in walls if w["phase"] == "study")
        + "); then "
        + ", ".join(f"{w['phase']} {w['wall_s']:.1f} s" for w in walls if w["phase"] != "study")
        + "."
        + (f" `configs verify --sample 20` verdicts: {verdicts}." if verdicts else "")
        + (f" The study's trials by state: {states}." if states else ""),
        "",
        *set_lines(plans),
    ]
    lines += ["", "Per bucket (plan µs / the bucket's best µs = regret):", ""]
    lines += [
        "| prefix | " + " | ".join(f"B {p['batch_bucket']['lo']}..{p['batch_bucket']['hi']}" for p in plans) + " |"
    ]
    lines += ["|---|" + "---|" * len(plans)]
    per = [buckets_of(p) for p in plans]
    for i, b in enumerate(per[0]):
        cells = [f"{c[i]['us']:.1f} / {c[i]['best_us']:.1f} = {c[i]['regret']:.3f}" for c in per]
        lines.append(f"| {b['prefix']} | " + " | ".join(cells) + " |")
    if bests:
        from verify_tuner import batches, buckets

        lines += [
            "",
            "The stored bests (each bucket's own best, the regrets' reference) where they are not the plan:",
            "",
        ]
        lines += ["| batch bucket | prefix bucket | best | µs | heuristic µs |", "|---|---|---|---|---|"]
        plan_of = {(p["batch_bucket"]["lo"], b["prefix_lo"]): b["config"] for p in plans for b in buckets_of(p)}
        for b in bests:
            bb, pb = batches.by_index(b["batch_bucket"]), buckets.by_index(b["bucket"])
            if b["config"] == plan_of.get((bb.lo, pb.lo)):
                continue
            lines.append(
                f"| {bb.lo}..{bb.hi} | {pb.lo}..{pb.hi} | {b['config']} | {b['median_us']:.1f} | {b['default_us']:.1f} |"
            )
    if args.studies:
        doc["measured_everywhere"] = everywhere = measured_everywhere(args.studies)
        lines += ["", *everywhere_lines(everywhere)]
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(plans, stem.with_suffix(".png"), f"{args.device}, {args.date}")
    print(f"wrote {stem}.{{json,md,png}}")


def measured_everywhere(studies: Path) -> dict[str, list[dict]]:
    """Per batch bucket, the configs the study measured at every prefix bucket (warm starts carry
    each bucket's best to the others), ranked by their mean time, with their regret against the
    fastest measured at each bucket: is there a config, plan finalist or not, good at both ends?"""
    import math

    import optuna
    from verify_tuner.keys import ConfigKey
    from verify_tuner.study_files import STUDY, study_urls

    times: dict[tuple[int, tuple], dict[int, float]] = {}
    for url in study_urls(f"sqlite:///{studies / STUDY}.db"):
        for name in optuna.get_all_study_names(storage=url):
            study = optuna.load_study(study_name=name, storage=url)
            key = ConfigKey.parse(study.user_attrs["workload_key"])
            bucket, bb = key.bucket, key.batch_bucket
            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
                times.setdefault((bb, tuple(sorted(t.params.items()))), {}).setdefault(bucket, t.value)
    out: dict[str, list[dict]] = {}
    for bb in sorted({bb for bb, _ in times}):
        per = {cfg: t for (b, cfg), t in times.items() if b == bb}
        all_buckets = sorted({k for t in per.values() for k in t})
        best = {k: min(t[k] for t in per.values() if k in t) for k in all_buckets}
        rows = []
        for cfg, t in per.items():
            if len(t) == len(all_buckets):
                regret = [t[k] / best[k] for k in all_buckets]
                rows.append(
                    {
                        "config": str(KernelConfig.from_params(dict(cfg))),
                        "mean_us": sum(t.values()) / len(t),
                        "regret_geomean": math.exp(sum(map(math.log, regret)) / len(regret)),
                        "regret_worst": max(regret),
                    }
                )
        out[str(bb)] = sorted(rows, key=lambda r: r["mean_us"])
    return out


def everywhere_lines(everywhere: dict[str, list[dict]]) -> list[str]:
    lines = [
        (
            "Configs the study measured at every prefix bucket (warm starts carry each bucket's best to the others), "
            "the four fastest on average per batch bucket, regret against the fastest measured at each bucket:"
        ),
        "",
        "| batch bucket | configs measured everywhere | config | mean µs | regret geomean | worst |",
        "|---|---|---|---|---|---|",
    ]
    for bb, rows in everywhere.items():
        for r in rows[:4]:
            lines.append(
                f"| {bb} | {len(rows)} | {r['config']} | {r['mean_us']:.1f} | {r['regret_geomean']:.3f} | "
                f"{r['regret_worst']:.3f} |"
            )
    return lines


def plot(plans: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for p in plans:
        label = f"B {p['batch_bucket']['lo']}..{p['batch_bucket']['hi']} ({p['range_count']} graphs)"
        bs = buckets_of(p)
        xs = [max(b["prefix"], 1) for b in bs]
        (line,) = axes[0].plot(xs, [b["us"] for b in bs], marker="o", label=f"{label} plan")
        axes[0].plot(xs, [b["best_us"] for b in bs], ls="--", color=line.get_color(), label=f"{label} best")
        axes[1].plot(xs, [b["regret"] for b in bs], marker="o", label=label)
        for at in p["breakpoints"]:
            axes[1].axvline(at, color=line.get_color(), ls=":", lw=0.8)
    axes[0].set(xscale="log", yscale="log", xlabel="prefix", ylabel="µs", title="plan vs each bucket's best")
    axes[1].axhline(TARGET[1], color="grey", ls=":", label=f"{TARGET[1]}x")
    axes[1].set(xscale="log", xlabel="prefix", ylabel="plan / best", title="regret per bucket")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Graph plans H=8 q=9 — {title}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
