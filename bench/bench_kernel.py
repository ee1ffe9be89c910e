"""Kernel benchmark on the local GPU: memory floor, naive torch, heuristic default, best of a
small sweep, per (H, Q, prefix). Writes JSON, a markdown table and a PNG under --out.

    python3 bench/bench_kernel.py --out OUT [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify_tuner import space
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.build import precompile
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.shapes import floor_bytes as bytes_moved_once
from verify_tuner.kernels.shapes import flops
from verify_tuner.kernels.validate import check

HS, QS, PREFIXES = (8, 16, 64, 128), (1, 9), (1024, 4096, 16384, 46000, 131072)


def sweep(limits, H, Q, P, base: KernelConfig) -> list[KernelConfig]:
    """The default, its NSPLIT neighbours among the tuner's candidates, the heuristic's other
    structure templates at the default's row tile, and the other head tiles with the default's
    structure: a small sweep around the default (not the tuner's whole space)."""
    from dataclasses import replace

    from verify_tuner.heuristic import _BANDWIDTH, _COMPUTE

    choices = space.nsplit_choices(H, limits, Q)
    i = choices.index(base.nsplit)
    out = {base} | {replace(base, nsplit=choices[j]) for j in (i - 2, i - 1, i + 1) if 0 <= j < len(choices)}
    for tk, block, stages, wr, wk, sf, pipe in _COMPUTE[:5] + _BANDWIDTH[:3]:
        out.add(replace(base, tk=tk, block=block, stages=stages, wr=wr, wk=wk, sf=sf, pipe=pipe))
    for ht in (d for d in (1, 2, 4, 8, 16) if H % d == 0 and 8 <= d * Q <= 80 and d != base.ht):
        groups = H // ht
        out.add(replace(base, ht=ht, qt=0, nsplit=max(1, limits.sm_count // groups)))
    return sorted(c for c in out if check(c, limits, H=H, q_len=Q) is None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument("--quick", action="store_true", help="H=8/64, Q=9, P=46000 only")
    ap.add_argument("--cache", default=os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache"))
    args = ap.parse_args()

    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as cuda
    import torch
    from benchlib import naive_torch
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.reference import poisoned_run_error, reference
    from verify_tuner.kernels.timing import copy_bandwidth, rotating_inputs, time_graph, time_launches

    limits = read_device_limits(0)
    shapes = (
        [(8, 9, 46000), (64, 9, 46000), (8, 1, 131072)]
        if args.quick
        else [(H, Q, P) for H in HS for Q in QS for P in PREFIXES]
    )
    plans = {}
    for H, Q, P in shapes:
        base = heuristic_config(limits, H=H, q_len=Q, prefix=P)
        plans[(H, Q, P)] = (base, sweep(limits, H, Q, P, base))
    jobs = {(c, Q) for (H, Q, P), (b, cs) in plans.items() for c in cs}
    for q in sorted({q for _, q in jobs}):
        precompile(sorted(c for c, qq in jobs if qq == q), q, limits.arch, Path(args.cache))
    print(f"compiled {len(jobs)} (config, q_len) modules for {limits.arch}", flush=True)

    bw = copy_bandwidth()
    stream = cuda.Stream()
    rows = []
    for (H, Q, P), (base, configs) in plans.items():
        sets = rotating_inputs(prefix_lens=[P], q_len=Q, H=H, l2_bytes=limits.l2_bytes, seed=H + Q + P)
        check_ref = reference(sets[0])[0]
        out = torch.empty(1, Q, H, 512, dtype=torch.bfloat16, device="cuda")
        naive = time_launches(lambda k, sets=sets: naive_torch(sets[k]), len(sets), reps=30)
        results = {}
        for cfg in configs:
            va = VerifyAttention(cfg, H=H, q_len=Q, limits=limits, max_batch=1, cache_dir=Path(args.cache))

            err = poisoned_run_error(
                lambda va=va, sets=sets, out=out: va.run(sets[0], out, stream=stream), out, check_ref
            )
            if err > 1e-2:
                print(f"WRONG {H=} {Q=} {P=} {cfg}: rel err {err:.3g}", flush=True)
                continue
            results[cfg] = time_graph(
                lambda k, va=va, sets=sets, out=out: va.run(sets[k], out, stream=stream), len(sets), stream=stream
            )
        best_cfg = min(results, key=lambda c: results[c].median_us)
        va = VerifyAttention(best_cfg, H=H, q_len=Q, limits=limits, max_batch=1, cache_dir=Path(args.cache))

        def partial_only(k, va=va, sets=sets, out=out):
            va.run(sets[k], out, reduce=False, stream=stream)

        partial_us = time_graph(partial_only, len(sets), stream=stream).median_us
        floor_bytes = bytes_moved_once([P], q_len=Q, H=H)
        row = {
            "H": H,
            "Q": Q,
            "prefix": P,
            "floor_us": floor_bytes / bw * 1e6,
            "naive_us": naive.median_us,
            "default_us": results[base].median_us if base in results else None,
            "default": str(base),
            "best_us": results[best_cfg].median_us,
            "best": str(best_cfg),
            "best_p10_us": results[best_cfg].p10_us,
            "best_p90_us": results[best_cfg].p90_us,
            "n_configs": len(results),
            "gflop": flops([P], q_len=Q, H=H) / 1e9,
            "best_partial_us": partial_us,
        }
        rows.append(row)
        print(
            f"H={H:4d} Q={Q:2d} P={P:7d} floor {row['floor_us']:7.1f} naive {row['naive_us']:8.1f} "
            f"default {row['default_us'] or float('nan'):8.1f} best {row['best_us']:8.1f}  {best_cfg}",
            flush=True,
        )
        sets = []  # free the inputs before the next shape
        torch.cuda.empty_cache()
    write_results(args.out, limits, bw, rows, quick=args.quick)


def write_results(out: Path, limits, bw: float, rows: list[dict], *, quick: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.date.today().isoformat()
    stem = f"kernel_{'quick_' if quick else ''}{limits.arch}"
    meta = {"device": limits.name, "arch": limits.arch, "date": stamp, "copy_bw_GBps": bw / 1e9, "rows": rows}
    (out / f"{stem}.json").write_text(json.dumps(meta, indent=1))
    geo = math.exp(
        sum(math.log(r["default_us"] / r["best_us"]) for r in rows if r["default_us"])
        / max(1, sum(1 for r in rows if r["default_us"]))
    )
    worst = max((r["default_us"] / r["best_us"] for r in rows if r["default_us"]), default=float("nan"))
    lines = [
        f"# Verify-attention kernel benchmark — {limits.name} ({limits.arch}), {stamp}",
        "",
        (
            f"Median µs per partial + reduce pair of CUDA-graph replays (inputs rotated past the "
            f"{limits.l2_bytes >> 20} MB L2; naive torch: eager, CUDA events, index tensors built per call). "
            f"Floor = bytes moved once / measured copy bandwidth {bw / 1e9:.0f} GB/s; TB/s = those bytes / best "
            "time. Best = fastest correct config of a small sweep around the heuristic default (NSPLIT "
            "neighbours, the other structure templates, other head tiles), not the tuner's whole space. "
            f"Default / best over these shapes: {geo:.3f}x (geometric mean), worst {worst:.3f}x."
        ),
        "",
        (
            "| H | Q | prefix | floor µs | naive torch µs | default µs | best µs (partial alone) | best/floor | "
            "TB/s | TFLOP/s | speedup vs naive | best config | default config |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = f"{r['default_us']:.1f}" if r["default_us"] else "wrong/absent"
        tbps = r["floor_us"] * bw / 1e12 / r["best_us"]
        lines.append(
            f"| {r['H']} | {r['Q']} | {r['prefix']} | {r['floor_us']:.1f} | {r['naive_us']:.1f} | {d} | "
            f"{r['best_us']:.1f} ({r['best_partial_us']:.1f}) | {r['best_us'] / r['floor_us']:.2f} | {tbps:.2f} | "
            f"{r['gflop'] / r['best_us'] * 1e3:.0f} | {r['naive_us'] / r['best_us']:.1f}x | "
            f"{r['best']} | {r['default']} |"
        )
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    plot(out / f"{stem}.png", limits, rows)


def plot(path: Path, limits, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r["H"], r["Q"]) for r in rows}, key=lambda k: (k[1], k[0]))
    ncols = min(4, len(keys))
    nrows = -(-len(keys) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4 * ncols, 3.4 * nrows), squeeze=False)
    for ax, (H, Q) in zip(axes.flat, keys):
        rs = sorted((r for r in rows if (r["H"], r["Q"]) == (H, Q)), key=lambda r: r["prefix"])
        x = [r["prefix"] for r in rs]
        for key, label, style in (
            ("floor_us", "memory floor", "k--"),
            ("naive_us", "naive torch", "r-o"),
            ("default_us", "heuristic default", "b-s"),
            ("best_us", "best of sweep", "g-^"),
        ):
            ax.plot(x, [r[key] if r[key] else float("nan") for r in rs], style, label=label, ms=4)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"H={H} Q={Q}")
        ax.set_xlabel("prefix tokens")
        ax.grid(True, which="both", alpha=0.3)
    for row in axes:
        row[0].set_ylabel("µs")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"MLA verify attention, {limits.name} ({limits.arch})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--replot":  # redraw the PNG from a results JSON
        from types import SimpleNamespace

        meta = json.loads(Path(sys.argv[2]).read_text())
        lim = SimpleNamespace(name=meta["device"], arch=meta["arch"], l2_bytes=60 << 20)
        write_results(Path(sys.argv[2]).parent, lim, meta["copy_bw_GBps"] * 1e9, meta["rows"], quick=False)
    else:
        main()
