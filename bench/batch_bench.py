"""Batched verify on the GPU (issue 12): which prefix statistic a batch's lookup should use, and
what batch-aware configs are worth. H=8 q_len=9 (TP8 on 64 heads, 9-node draft tree).

Part 1, the statistic. For B in {4, 16, 32} and two spreads (uniform 0.5x..1.5x around a mean
of 16384; one long request among short ones), time a candidate set of configs on the ragged
batch itself (its best = what a perfect lookup would pick). A table tuned per (batch bucket,
prefix bucket) holds, for a bucket, the best candidate on an equal-length batch at that bucket's
middle; each statistic (mean, max) names a bucket, so its lookup picks that bucket's config.
Regret = time of the picked config on the ragged batch / the ragged batch's best.

Part 2, the benchmark. For B in {1, 8, 32} and prefix centres {4096, 46000} (ragged, uniform,
longest request = the centre): the best of the candidate set at that B ("tuned for B"), the
best at B=1 applied at B ("B=1 config"), and the heuristic, in us and as a ratio to
max(memory floor, FLOP / 645 TFLOP/s). Plus the issue-10 target shape: B=32, prefixes 20k..70k.

Every config is gated against the fp32 reference on its batch before it is timed; timings are
CUDA-graph replays with inputs past the L2 (verify_tuner.kernels.timing).

    python3 bench/batch_bench.py --out OUT [--variant ilp=-DVA_SOFTMAX_ILP]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify_tuner import batches, buckets
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.shapes import D_V, floor_bytes, flops

H, Q = 8, 9
MMA_TFLOPS = 645.0  # mma.sync ceiling on the H200 (../shared/anchors/h200.md)
STRUCTURES = (  # the heuristic's long-prefix and short-split structures (tuner/heuristic.py)
    {"tk": 32, "block": 256, "stages": 2, "wr": 2, "wk": 4, "sf": 0, "pipe": 1},
    {"tk": 32, "block": 256, "stages": 3, "wr": 2, "wk": 2, "sf": 0, "pipe": 0},
)


def candidates(limits, batch: int, extra: list[KernelConfig]) -> list[KernelConfig]:
    sms = limits.sm_count
    nsplits = sorted({max(1, round(sms * k / batch)) for k in (0.25, 0.5, 0.75, 1, 1.5, 2)})
    out = [KernelConfig(nsplit=n, ht=8, **s) for s in STRUCTURES for n in nsplits]
    return out + [c for c in extra if c not in out]


class Bench:
    def __init__(self, args) -> None:
        import pycuda.autoprimaryctx  # noqa: F401
        import pycuda.driver as cuda
        from verify_tuner.kernels.limits import read_device_limits
        from verify_tuner.kernels.timing import copy_bandwidth

        self.limits = read_device_limits(0)
        self.bw = copy_bandwidth()
        self.stream = cuda.Stream()
        self.cache = Path(args.cache)
        self.flags = tuple(args.flags.split()) if args.flags else ()
        self.memo: dict[tuple, float | None] = {}

    def floor_us(self, lens: list[int]) -> float:
        mem = floor_bytes(lens, q_len=Q, H=H) / self.bw * 1e6
        return max(mem, flops(lens, q_len=Q, H=H) / (MMA_TFLOPS * 1e12) * 1e6)

    def time_all(self, lens: list[int], cfgs: list[KernelConfig], tag: str) -> dict[KernelConfig, float | None]:
        """Gate then time every config on this batch (one input build); None = failed the gate."""
        import torch
        from verify_tuner.kernels.launch import VerifyAttention
        from verify_tuner.kernels.reference import poisoned_run_error, reference
        from verify_tuner.kernels.timing import rotating_inputs, time_graph

        key = tuple(lens)
        todo = [c for c in cfgs if (key, c) not in self.memo]
        if todo:
            sets = rotating_inputs(prefix_lens=lens, q_len=Q, H=H, l2_bytes=self.limits.l2_bytes, seed=len(lens))
            ref = reference(sets[0])[0]
            out = torch.empty(len(lens), Q, H, D_V, dtype=torch.bfloat16, device="cuda")
            for c in todo:
                va = VerifyAttention(
                    c,
                    H=H,
                    q_len=Q,
                    limits=self.limits,
                    max_batch=len(lens),
                    cache_dir=self.cache,
                    extra_flags=self.flags,
                )
                err = poisoned_run_error(lambda va=va: va.run(sets[0], out, stream=self.stream), out, ref)
                if not err <= 1e-2:
                    print(f"  GATE FAILED {c}: rel err {err:.3g}", flush=True)
                    self.memo[(key, c)] = None
                    continue
                t = time_graph(
                    lambda k, va=va: va.run(sets[k], out, stream=self.stream), len(sets), stream=self.stream, replays=10
                )
                self.memo[(key, c)] = t.median_us
            del sets, ref, out
            torch.cuda.empty_cache()
        res = {c: self.memo[(key, c)] for c in cfgs}
        ok = {c: v for c, v in res.items() if v is not None}
        best = min(ok, key=ok.get)
        print(
            f"{tag}: B={len(lens)} max={max(lens)} mean={sum(lens) // len(lens)} best {ok[best]:.1f} us {best}",
            flush=True,
        )
        return res


def best_of(res: dict[KernelConfig, float | None]) -> KernelConfig:
    ok = {c: v for c, v in res.items() if v is not None}
    return min(ok, key=ok.get)


def part_statistic(b: Bench, mean_centre: int) -> list[dict]:
    rows = []
    for batch in (4, 16, 32):
        cands = candidates(b.limits, batch, [])
        for spread in ("uniform", "one-long"):
            lens = batches.draw_prefixes(batch=batch, centre=mean_centre, spread=spread, statistic="mean", seed=1)
            ragged = b.time_all(lens, cands, f"ragged {spread}")
            best = best_of(ragged)
            row = {
                "batch": batch,
                "spread": spread,
                "max": max(lens),
                "mean": round(sum(lens) / batch),
                "best_us": ragged[best],
                "best": str(best),
            }
            for stat in ("mean", "max"):
                mid = buckets.bucket_of(batches.prefix_of(lens, stat)).mid
                table = best_of(b.time_all([mid] * batch, cands, f"equal at the {stat} bucket"))
                us = ragged[table]
                row[f"{stat}_bucket_mid"] = mid
                row[f"{stat}_us"] = us
                row[f"{stat}_regret"] = (us / ragged[best]) if us else None
                row[f"{stat}_config"] = str(table)
            rows.append(row)
    return rows


def part_benchmark(b: Bench) -> list[dict]:
    rows = []
    for centre in (4096, 46000):
        b1_best = None
        for batch in (1, 8, 32):
            lens = batches.draw_prefixes(batch=batch, centre=centre, spread="uniform", statistic="max", seed=2)
            heur = heuristic_config(b.limits, H=H, q_len=Q, prefix=centre, batch=batch)
            extra = [heur] + ([replace(b1_best)] if b1_best else [])
            res = b.time_all(lens, candidates(b.limits, batch, extra), "benchmark")
            tuned = best_of(res)
            if batch == 1:
                b1_best = tuned
            floor = b.floor_us(lens)
            row = {
                "centre": centre,
                "batch": batch,
                "lens_min": min(lens),
                "lens_max": max(lens),
                "floor_us": floor,
                "tuned": str(tuned),
                "tuned_us": res[tuned],
                "heuristic": str(heur),
                "heuristic_us": res[heur],
                "b1": str(b1_best),
                "b1_us": res[b1_best],
            }
            rows.append(row)
    return rows + [part_target(b)]


def part_target(b: Bench) -> dict:
    """Issue 10's ragged target: B=32, prefixes ~27k..70k (seeded)."""
    lens = batches.draw_prefixes(batch=32, centre=70000, spread="uniform", statistic="max", seed=3)
    heur = heuristic_config(b.limits, H=H, q_len=Q, prefix=70000, batch=32)
    res = b.time_all(lens, candidates(b.limits, 32, [heur]), "target B=32 20k..70k")
    tuned = best_of(res)
    return {
        "centre": 70000,
        "batch": 32,
        "lens_min": min(lens),
        "lens_max": max(lens),
        "floor_us": b.floor_us(lens),
        "tuned": str(tuned),
        "tuned_us": res[tuned],
        "heuristic": str(heur),
        "heuristic_us": res[heur],
        "b1": None,
        "b1_us": None,
        "target": True,
        "tflops": flops(lens, q_len=Q, H=H) / (res[tuned] * 1e-6) / 1e12,
        "tbps": floor_bytes(lens, q_len=Q, H=H) / (res[tuned] * 1e-6) / 1e12,
    }


def write(out: Path, b: Bench, stat_rows: list[dict], bench_rows: list[dict]) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    arch = b.limits.arch
    meta = {
        "device": b.limits.name,
        "arch": arch,
        "date": dt.date.today().isoformat(),
        "copy_bw_gbps": b.bw / 1e9,
        "torch": torch.__version__,
        "flags": list(b.flags),
    }
    (out / f"batch_{arch}.json").write_text(
        json.dumps({"meta": meta, "statistic": stat_rows, "benchmark": bench_rows}, indent=1)
    )
    lines = [
        f"# Batched verify, H={H} q_len={Q} — {b.limits.name} ({arch}), {meta['date']}",
        "",
        (
            "`python3 bench/batch_bench.py --out OUT`; CUDA-graph replays, inputs past the L2, every "
            f"config gated against the fp32 reference on its batch; copy bandwidth {b.bw / 1e9:.0f} GB/s."
        ),
        "",
        "## Which prefix describes a batch",
        "",
        "Regret = time of the config a statistic's lookup picks / the best candidate on that ragged batch.",
        "",
        "| B | spread | mean | max | best µs | mean → bucket mid | regret | max → bucket mid | regret |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in stat_rows:
        lines.append(
            f"| {r['batch']} | {r['spread']} | {r['mean']} | {r['max']} | {r['best_us']:.1f} | "
            f"{r['mean_bucket_mid']} | {_x(r['mean_regret'])} | {r['max_bucket_mid']} | "
            f"{_x(r['max_regret'])} |"
        )
    lines += [
        "",
        "## Batch-aware configs",
        "",
        (
            "| prefixes | B | floor µs | tuned for B µs (× floor) | B=1 config µs (× floor) | heuristic µs "
            "(× floor) | tuned config |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for r in bench_rows:
        f = r["floor_us"]
        lines.append(
            f"| {r['lens_min']}..{r['lens_max']} | {r['batch']} | {f:.1f} | {_us(r['tuned_us'], f)} | "
            f"{_us(r['b1_us'], f)} | {_us(r['heuristic_us'], f)} | {r['tuned']} |"
        )
    (out / f"batch_{arch}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def write_target(out: Path, b: Bench, r: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    arch = b.limits.arch
    meta = {
        "device": b.limits.name,
        "arch": arch,
        "date": dt.date.today().isoformat(),
        "copy_bw_gbps": b.bw / 1e9,
        "flags": list(b.flags),
    }
    (out / f"batch_target_{arch}.json").write_text(json.dumps({"meta": meta, "target": r}, indent=1))
    f = r["floor_us"]
    lines = [
        f"# Issue 10's ragged batch target, H={H} q_len={Q} — {b.limits.name} ({arch}), {meta['date']}",
        "",
        (
            "`python3 bench/batch_bench.py --target-only --out OUT`; CUDA-graph replays, inputs past the "
            "L2, every config gated against the fp32 reference on the batch; limit = max(memory floor at "
            f"{b.bw / 1e9:.0f} GB/s, FLOP / {MMA_TFLOPS:.0f} TFLOP/s); target <= 1.5x the limit."
        ),
        "",
        "| prefixes | B | limit µs | best swept µs (× limit) | heuristic µs (× limit) | TFLOP/s | TB/s | best config |",
        "|---|---|---|---|---|---|---|---|",
        (
            f"| {r['lens_min']}..{r['lens_max']} | {r['batch']} | {f:.1f} | {_us(r['tuned_us'], f)} | "
            f"{_us(r['heuristic_us'], f)} | {r['tflops']:.0f} | {r['tbps']:.2f} | {r['tuned']} |"
        ),
    ]
    (out / f"batch_target_{arch}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _x(v: float | None) -> str:
    return "failed" if v is None else f"{v:.2f}×"


def _us(v: float | None, floor: float) -> str:
    return "-" if v is None else f"{v:.1f} ({v / floor:.2f}×)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument("--cache", default=os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache"))
    ap.add_argument("--flags", default="", help="nvcc flags for every config (e.g. -DVA_SOFTMAX_ILP)")
    ap.add_argument("--mean-centre", type=int, default=16384)
    ap.add_argument(
        "--target-only",
        action="store_true",
        help="only issue 10's B=32 ragged target shape: writes batch_target_<arch>.{md,json}",
    )
    args = ap.parse_args()
    b = Bench(args)
    if args.target_only:
        write_target(args.out, b, part_target(b))
        return
    stat_rows = part_statistic(b, args.mean_centre)
    bench_rows = part_benchmark(b)
    write(args.out, b, stat_rows, bench_rows)


if __name__ == "__main__":
    main()
