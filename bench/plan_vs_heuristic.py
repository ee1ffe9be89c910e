"""Does a tuned graph plan beat the heuristic where the engine runs it? On the local GPU, for each
batch size's stored graph plan set (`tuner study graph-plan`), time the config of the plan's
range holding the batch's longest prefix (the graph the engine replays for it) and the
heuristic's side by side on batches the study never measured: prefixes drawn log-uniformly over
the plan's range (not the buckets' representative prefixes) and ragged draws of other seeds.

    python3 bench/plan_vs_heuristic.py --H 8 --q-len 9 --prefix-range 1024:131072 --batch 1,8,32 \
        --draws 4 --out OUT

Reads the plans from TUNER_DATABASE_URL; writes plan_vs_heuristic_<arch>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify_tuner import batches
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.build import precompile
from verify_tuner.kernels.shapes import D_V

ROUNDS, REPS = 3, 10
SEED_BASE = 1000  # the study draws its ragged batches with seed 0


def draws(lo: int, hi: int, batch: int, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed * 7919 + batch)
    out = []
    for i in range(n):
        centre = round(math.exp(rng.uniform(math.log(max(lo, 1)), math.log(hi))))
        out.append(batches.draw_prefixes(batch=batch, centre=centre, spread="uniform", seed=SEED_BASE + i))
    return out


def chosen(plan, lens: list[int]) -> tuple[int, Any]:  # type: ignore[no-untyped-def]
    """(range index, config) of the plan set's graph a batch of these prefixes replays."""
    i = plan.index_of(max(lens))
    return i, plan.ranges[i].config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--H", type=int, required=True)
    ap.add_argument("--q-len", type=int, required=True)
    ap.add_argument("--prefix-range", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--draws", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument("--cache", default=os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache"))
    ap.add_argument(
        "--neighbour-mb",
        type=int,
        default=0,
        help="time each launch followed by a GEMM over this many MB, its own time subtracted (as the study's "
        "--neighbour-mb; default 0: back to back)",
    )
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.prefix_range.split(":"))
    H, Q = args.H, args.q_len

    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as cuda
    from verify_tuner.kernels.build import kernel_hash
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.timing import check_neighbour_mb, neighbour_gemm
    from verify_tuner.keys import TableKey
    from verify_tuner.store.migrate import checked_sessions
    from verify_tuner.store.plans import served_sets

    try:
        check_neighbour_mb(args.neighbour_mb)
    except ValueError as exc:
        ap.error(str(exc))
    limits, stream = read_device_limits(0), cuda.Stream()
    between = neighbour_gemm(args.neighbour_mb) if args.neighbour_mb else None
    sessions = checked_sessions(os.environ["TUNER_DATABASE_URL"])
    with sessions() as s:
        plans = served_sets(session=s, table=TableKey(limits.name, kernel_hash(), "bf16", H, Q))
    rows = []
    for batch in sorted({int(b) for b in args.batch.split(",")}):
        plan = plans.get(batches.bucket_of(batch).index)
        if plan is None:
            sys.exit(f"no stored graph plan for batch {batch} on {limits.name}: run `tuner study graph-plan` first")
        heuristic = heuristic_config(limits, H=H, q_len=Q, prefix=hi, batch=batch)
        configs = sorted({r.config for r in plan.ranges} | {heuristic})
        for failure in precompile(configs, Q, limits.arch, Path(args.cache)):
            sys.exit(f"COMPILE FAILED {failure[:300]}")
        kernels = {
            cfg: VerifyAttention(cfg, H=H, q_len=Q, limits=limits, max_batch=batch, cache_dir=Path(args.cache))
            for cfg in configs
        }
        for lens in draws(lo, hi, batch, args.draws, args.seed):
            i, cfg = chosen(plan, lens)
            named = {"plan": cfg, "heuristic": heuristic}
            medians = _timed(lens, {c: kernels[c] for c in set(named.values())}, limits, stream, between, H, Q)
            row = {"batch": batch, "max_prefix": max(lens), "total_tokens": sum(lens), "range": i}
            row |= {f"{k}_us": medians[c] for k, c in named.items()} | {k: str(c) for k, c in named.items()}
            row["speedup"] = row["heuristic_us"] / row["plan_us"]
            rows.append(row)
            print(
                f"B={batch:3d} max prefix {max(lens):7d} (range {i}): plan {row['plan_us']:8.1f} us  heuristic "
                f"{row['heuristic_us']:8.1f} us  {row['speedup']:.3f}x",
                flush=True,
            )
    write(args.out, limits, rows, args)


def _timed(lens: list[int], kernels: dict, limits, stream, between, H: int, Q: int) -> dict:  # type: ignore[no-untyped-def]
    """Each kernel's median µs on one draw, interleaved, checked against the reference first."""
    import torch
    from benchlib import checked_launcher, interleaved_medians
    from verify_tuner.kernels.reference import reference
    from verify_tuner.kernels.timing import rotating_inputs

    sets = rotating_inputs(prefix_lens=lens, q_len=Q, H=H, l2_bytes=limits.l2_bytes, seed=SEED_BASE + sum(lens))
    ref = reference(sets[0])[0]
    out = torch.empty(len(lens), Q, H, D_V, dtype=torch.bfloat16, device="cuda")
    what = f"B={len(lens)} prefixes {min(lens)}..{max(lens)}"
    launchers = {cfg: checked_launcher(va, sets, out, ref, what, stream=stream) for cfg, va in kernels.items()}
    if between is not None:
        launchers["neighbour"] = lambda k: None
    medians = interleaved_medians(launchers, len(sets), rounds=ROUNDS, reps=REPS, stream=stream, between=between)
    if between is not None:
        alone = medians.pop("neighbour")
        medians = {k: v - alone for k, v in medians.items()}
    del sets, ref, out, launchers
    torch.cuda.empty_cache()
    return medians


def write(out: Path, limits, rows: list[dict], args: argparse.Namespace) -> None:  # type: ignore[no-untyped-def]
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.date.today().isoformat()
    stem = f"plan_vs_heuristic_{limits.arch}"
    per_batch = {
        b: statistics.geometric_mean([r["speedup"] for r in rows if r["batch"] == b])
        for b in {r["batch"] for r in rows}
    }
    overall = statistics.geometric_mean(list(per_batch.values()))
    doc = {
        "device": limits.name,
        "arch": limits.arch,
        "date": stamp,
        "neighbour_mb": args.neighbour_mb,
        "per_batch_geomean": per_batch,
        "rows": rows,
    }
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    lines = [
        f"# Graph plan vs heuristic on unseen draws — {limits.name} ({limits.arch}), {stamp}",
        "",
        (
            f"`python3 bench/plan_vs_heuristic.py --H {args.H} --q-len {args.q_len} --prefix-range {args.prefix_range} "
            f"--batch {args.batch} --draws {args.draws} --neighbour-mb {args.neighbour_mb}`: per batch size, the stored graph plan and the heuristic "
            "timed side by side in CUDA graphs (median of "
            f"{ROUNDS} interleaved rounds of {REPS} replays, inputs rotated past the L2, output checked against the fp32 "
            "reference first) on batches the study never measured (prefixes log-uniform over the range, ragged draws "
            "of other seeds)."
        ),
        "",
        "Heuristic / plan, geometric mean per batch size: "
        + ", ".join(f"B={b} **{g:.3f}x**" for b, g in sorted(per_batch.items()))
        + f"; over the batch sizes **{overall:.3f}x**.",
        "",
        "| batch | max prefix | tokens | range | plan µs | heuristic µs | heuristic/plan | plan |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['max_prefix']} | {r['total_tokens']} | {r.get('range', 0)} | {r['plan_us']:.1f} | "
            f"{r['heuristic_us']:.1f} | {r['speedup']:.3f} | {r['plan']} |"
        )
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
