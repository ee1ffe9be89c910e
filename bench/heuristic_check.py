"""Does the heuristic default (what the sidecar answers before anything is tuned) hold up? On the
local GPU, for every shape of a kernel benchmark JSON, time side by side: the default that
benchmark measured (an earlier heuristic), the current heuristic's default and that benchmark's
best-of-sweep config. Rounds interleave the configs so drift hits all alike.

    python3 bench/heuristic_check.py bench/results/kernel_sm_90.json --out OUT

Writes heuristic_<arch>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import parse_config
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.build import precompile
from verify_tuner.kernels.shapes import D_V

ROUNDS, REPS = 3, 10


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_json", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument("--cache", default=os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache"))
    args = ap.parse_args()

    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as cuda
    import torch
    from benchlib import checked_launcher, interleaved_medians
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.reference import reference
    from verify_tuner.kernels.timing import rotating_inputs

    limits, stream = read_device_limits(0), cuda.Stream()
    recorded = json.loads(args.bench_json.read_text())
    if recorded["arch"] != limits.arch:
        sys.exit(f"{args.bench_json} was measured on {recorded['arch']}, this GPU is {limits.arch}")
    plans = []
    for r in recorded["rows"]:
        H, Q, P = r["H"], r["Q"], r["prefix"]
        named = {
            "recorded default": parse_config(r["default"]),
            "best of sweep": parse_config(r["best"]),
            "heuristic now": heuristic_config(limits, H=H, q_len=Q, prefix=P),
        }
        plans.append((H, Q, P, named))
    jobs = {(c, Q) for _, Q, _, named in plans for c in named.values()}
    for q in sorted({Q for _, Q in jobs}):
        for failure in precompile(sorted(c for c, Q in jobs if Q == q), q, limits.arch, Path(args.cache)):
            raise SystemExit(f"COMPILE FAILED {failure[:300]}")
    print(f"compiled {len(jobs)} modules for {limits.arch}", flush=True)

    rows = []
    for H, Q, P, named in plans:
        sets = rotating_inputs(prefix_lens=[P], q_len=Q, H=H, l2_bytes=limits.l2_bytes, seed=H + Q + P)
        ref = reference(sets[0])[0]
        out = torch.empty(1, Q, H, D_V, dtype=torch.bfloat16, device="cuda")
        launchers = {
            cfg: checked_launcher(
                VerifyAttention(cfg, H=H, q_len=Q, limits=limits, max_batch=1, cache_dir=Path(args.cache)),
                sets,
                out,
                ref,
                f"H={H} Q={Q} P={P} {cfg}",
                stream=stream,
            )
            for cfg in set(named.values())
        }
        medians = interleaved_medians(launchers, len(sets), rounds=ROUNDS, reps=REPS, stream=stream)
        us = {name: medians[cfg] for name, cfg in named.items()}
        row = {
            "H": H,
            "Q": Q,
            "prefix": P,
            **{f"{k} us": v for k, v in us.items()},
            **{k: str(v) for k, v in named.items()},
        }
        rows.append(row)
        print(
            f"H={H:4d} Q={Q:2d} P={P:7d} recorded default {us['recorded default']:8.1f}  "
            f"now {us['heuristic now']:8.1f}  best {us['best of sweep']:8.1f}  ({named['heuristic now']})",
            flush=True,
        )
        sets = []
        torch.cuda.empty_cache()
    write(args.out, limits, rows, args.bench_json)


def write(out: Path, limits, rows: list[dict], source: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.date.today().isoformat()
    stem = f"heuristic_{limits.arch}"
    (out / f"{stem}.json").write_text(
        json.dumps(
            {"device": limits.name, "arch": limits.arch, "date": stamp, "source": source.name, "rows": rows}, indent=1
        )
    )
    ratio_now = [r["heuristic now us"] / r["best of sweep us"] for r in rows]
    ratio_old = [r["recorded default us"] / r["best of sweep us"] for r in rows]
    lines = [
        f"# Heuristic default vs best of sweep — {limits.name} ({limits.arch}), {stamp}",
        "",
        (
            f"Configs from `{source.name}` (its default = the earlier heuristic, its best-of-sweep) and the current "
            f"`verify_tuner.heuristic`, re-timed side by side: median of {ROUNDS} interleaved rounds of {REPS} launches "
            "(inputs rotated past the L2), output checked against the fp32 reference first."
        ),
        "",
        (
            f"Time / best-of-sweep, geometric mean over {len(rows)} shapes: earlier default "
            f"**{statistics.geometric_mean(ratio_old):.2f}×** (worst {max(ratio_old):.2f}×), current default "
            f"**{statistics.geometric_mean(ratio_now):.2f}×** (worst {max(ratio_now):.2f}×)."
        ),
        "",
        (
            "| H | Q | prefix | earlier default µs | current default µs | best of sweep µs | current/best | "
            "current default | best config |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r, q in zip(rows, ratio_now):
        lines.append(
            f"| {r['H']} | {r['Q']} | {r['prefix']} | {r['recorded default us']:.1f} | "
            f"{r['heuristic now us']:.1f} | {r['best of sweep us']:.1f} | {q:.2f} | {r['heuristic now']} | "
            f"{r['best of sweep']} |"
        )
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 4))
    x = range(len(rows))
    ax.plot(x, ratio_old, "rs", label="earlier default / best")
    ax.plot(x, ratio_now, "bo", label="current default / best")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(x), [f"H{r['H']} Q{r['Q']} {r['prefix'] // 1024}k" for r in rows], rotation=90, fontsize=7)
    ax.set_ylabel("time / best of sweep")
    ax.set_title(f"Heuristic default vs best of sweep, {limits.name} ({limits.arch}), {stamp}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=110)


if __name__ == "__main__":
    main()
