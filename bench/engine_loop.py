"""A speculative-decoding engine's verify loop through the SGLang backend's own code path
(VerifyMLABackend, driven by its hooks in SGLang's order), per batch size {1, 8, 32}: 300 steps
of CUDA graphs captured at the first step, one per prefix range of the batch size's graph plan
set (SGLang's attention variants: the label set at each capture, the label `select` gives before
each replay; the runner's static buffers; the in-graph refill and every layer's attention, a KV
pool a layer so a step reads more than the L2 holds). The first 150 steps hold the batch around
its first breakpoint, so its longest prefix crosses it and the step replays the other range's
graph; the last 150 spread the requests over 0..131k, joining at P=0 and at long prompts. The
draft trees are EAGLE trees (topk 4) in SGLang's FULL_MASK layout, written where SGLang's draft
stage writes them. Every step one layer's output (in turn) is checked against fp32 attention
computed from SGLang's tensors; every 25th step the graph replayed is timed against a graph of the
same range captured fresh at that step; a row whose worst step's relative error passes GATE (the
kernel tests' 1e-2) says so, and the script exits 1 once every row is saved if one does not. The loop runs for each KV pool dtype the kernel reads
(bf16 and e4m3, the latter in each mode: fp8_e4m3 and fp8_e4m3_qk, whose reference takes q
quantized as the kernel does; `--kv-dtypes` picks; a mode the GPU cannot run says why in its row).

The ranges: a `tuner configs dump` folder's graph plan sets (--config-dir, the table
`tuner study graph-plan` chose), else two ranges split at --split: SHORT below it, the heuristic
above (a check of the mechanism, not of a plan).

    python3 bench/engine_loop.py --out $OUT [--config-dir DUMP]     # on the GPU machine
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import statistics
import tempfile
from collections import Counter
from pathlib import Path

import torch
from engine_steps import LoopEngine, Q, Schedule
from verify_tuner.engine.sglang_backend import mla_pool_reason
from verify_tuner.engine.tree_masks import TreeMaskMode
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.formats import FORMATS, KV_DTYPES
from verify_tuner.keys import check_kv_dtype

STEPS, TIME_EVERY, CROSSING = 300, 25, 150
GATE = 1e-2  # the kernel tests' gate on the relative error, for every format
MAX_PREFIX = 131_071
#: a short-prefix config (small blocks) for the two ranges without a plan; valid on sm_90 and sm_120
SHORT = KernelConfig(nsplit=24, ht=8, tk=32, block=256, qt=2, wk=2)


def schedules(bs: int, breakpoint: int) -> tuple[Schedule, Schedule]:
    """(crossing, spread): the batch's requests 60.. tokens below `breakpoint`, finishing 250.. past
    it and joining at P=0; then spread over 0..131k (B=1: a long prompt), joining at P=0 and at
    long prompts. Same rows, so one engine holds both."""
    below = [max(breakpoint - 60 - 7 * i, 0) for i in range(bs)]
    crossing = Schedule(below, [breakpoint + 250 + 5 * i for i in range(bs)], seed=bs)
    starts = [100_000] if bs == 1 else [round(2 ** (17 * i / (bs - 1))) - 1 + 100 * i for i in range(bs)]
    starts = [min(s, 124_000) for s in starts]
    spread = Schedule(starts, [s + 400 for s in starts], seed=bs + 1, joins=(0, 64_000, 120_000), run=400)
    return crossing, spread


def _timed(fn, n: int = 9) -> float:
    """Median µs of n runs of fn, CUDA events around each."""
    times = []
    for _ in range(n):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0)
    return statistics.median(times)


def capture(eng: LoopEngine, label: str | None = None, pool=None) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor]]:  # type: ignore[no-untyped-def]
    """SGLang's capture of one (batch size, attention variant): the variant set, out_graph(in_capture=True),
    a warm-up on a side stream, then the graph, in `pool` (SGLang captures every graph in one pool)."""
    eng.label = label
    eng.out_graph(in_capture=True)
    eng.label = None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eng.forward()  # loads the cubin, makes the op's plans
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=side):
        outs = eng.forward()
    return graph, outs


def loop(bs: int, *, layers: int, pick_ranges, pool_dtype: torch.dtype, kv_dtype: str | None = None) -> dict:
    starts = [s for s, _ in pick_ranges(Q, bs)]
    crossing, spread = schedules(bs, starts[1] if len(starts) > 1 else 4096)
    eng = LoopEngine(spread, layers=layers, device="cuda", pick_ranges=pick_ranges, mode=TreeMaskMode.FULL_MASK,
                     pool_dtype=pool_dtype, kv_dtype=kv_dtype)  # fmt: skip
    eng.sched = crossing  # the first phase; the engine's rows and width hold both
    eng.prepare()
    before, pool = torch.cuda.memory_allocated(), torch.cuda.graph_pool_handle()
    graphs = {label: capture(eng, label, pool) for label in eng.labels}
    graph_mb = (torch.cuda.memory_allocated() - before) / 2**20
    errors, timings, replayed = [], [], []
    for step in range(STEPS):
        if step == CROSSING:
            eng.sched = spread
        eng.prepare()
        label = eng.select()  # SGLang asks the variants, then prepares the replay and replays that graph
        eng.out_graph()
        graph, outs = graphs[label]
        graph.replay()
        torch.cuda.synchronize()
        errors.append(eng.error(outs, step % layers))
        replayed.append((label, max(eng.sched.lens)))
        if step % TIME_EVERY == 0:
            timings.append(_timing(eng, step, graph, label, layers))
        eng.sched.advance()
    return _row(bs, eng, pick_ranges, pool_dtype, layers, graph_mb, errors, timings, replayed)


def _timing(eng: LoopEngine, step: int, graph: torch.cuda.CUDAGraph, label: str | None, layers: int) -> dict:
    kept = _timed(graph.replay) / layers
    fresh_graph, _ = capture(eng, label)
    eng.out_graph()
    fresh = _timed(fresh_graph.replay) / layers
    return {"step": step, "range": label, "prefix max": max(eng.sched.lens), "kept us/layer": round(kept, 2),
            "fresh us/layer": round(fresh, 2), "kept / fresh": round(kept / fresh, 3)}  # fmt: skip


def _row(bs, eng, pick_ranges, pool_dtype, layers, graph_mb, errors, timings, replayed) -> dict:  # type: ignore[no-untyped-def]
    labels = [label for label, _ in replayed]
    return {
        "batch": bs, "pool dtype": str(pool_dtype).removeprefix("torch."), "kv_dtype": eng.backend.kv_dtype,
        "layers": layers, "steps": STEPS,
        "ranges": [{"from": s, "config": str(c)} for s, c in pick_ranges(Q, bs)], "graphs": len(eng.labels),
        "graph MB": round(graph_mb, 1), "workspace MB": round(eng.backend.workspace_bytes() / 2**20, 2),
        "steps per range": dict(Counter(str(label) for label in labels)),
        "range changes": sum(a != b for a, b in itertools.pairwise(labels)),
        "prefix max seen": max(p for _, p in replayed), "prefix min of longest": min(p for _, p in replayed),
        "requests joined": eng.sched.joined, "length syncs": eng.backend.graphs.length_syncs,
        "rel err max": max(e[0] for e in errors), "abs err max": max(e[1] for e in errors),
        "steps checked": len(errors), f"rel err max <= {GATE:g}": max(e[0] for e in errors) <= GATE,
        "steps over the gate": sum(e[0] > GATE for e in errors),
        # where the error is largest: the step, its relative error, the batch's longest prefix then
        "worst steps": [{"step": i, "rel err": errors[i][0], "prefix max": replayed[i][1]}
                        for i in sorted(range(len(errors)), key=lambda i: -errors[i][0])[:5]],
        "timed": timings,
        "kept / fresh median": statistics.median(t["kept / fresh"] for t in timings),
        "kept / fresh max": max(t["kept / fresh"] for t in timings),
    }  # fmt: skip


def range_picker(limits, config_dir: Path | None, split: int, kv_dtype: str = "bf16"):  # type: ignore[no-untyped-def]
    """pick_ranges(q, bs): the dump's plan sets for the `kv_dtype` cache through the config client, else
    SHORT | that format's heuristic default at `split` (what the service answers an engine holding it)."""
    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.kernels.validate import check

    if config_dir is not None:
        from verify_tuner.engine.client import ConfigClient

        snaps = Path(tempfile.mkdtemp())  # the client keeps no snapshot of a folder's table: an empty one
        client = ConfigClient(H=8, q_len=Q, device=limits.name, kv_dtype=kv_dtype, config_dir=config_dir,
                              snapshot_dir=snaps)  # fmt: skip
        if client.fetch() != "config_dir":
            raise SystemExit(f"no table in {config_dir}: {client.reason}")
        plans = lambda q, bs: client.graph_plans(bs, max_prefix=MAX_PREFIX)
        return lambda q, bs: tuple((r.prefix_range[0] if i else 0, r.config) for i, r in enumerate(plans(q, bs)))
    if why := check(SHORT, limits, H=8, q_len=Q, kv_dtype=kv_dtype):
        raise SystemExit(f"{SHORT} cannot run on {limits.name} with a {kv_dtype} cache: {why}")
    return lambda q, bs: (
        (0, SHORT),
        (split, heuristic_config(limits, H=8, q_len=q, prefix=4096, batch=bs, kv_dtype=kv_dtype)),
    )


def kv_dtypes_arg(text: str) -> list[str]:
    """An argparse type: formats the kernel reads and SGLang's MLA pool holds, comma-separated
    (keys.check_kv_dtype's refusals, then sglang_backend.mla_pool_reason's), each run on the pool
    SGLang holds for it (bf16, or e4m3 for an e4m3 format)."""
    try:
        names = [check_kv_dtype(t) for t in text.split(",") if t]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    for name in names:
        if reason := mla_pool_reason(FORMATS[name]):
            raise argparse.ArgumentTypeError(reason)
    return names


#: The formats the loop runs by default: every one the kernel reads that SGLang's MLA pool holds.
MLA_POOL_FORMATS = [k for k in KV_DTYPES if mla_pool_reason(FORMATS[k]) is None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--config-dir", type=Path, default=None, help="a `tuner configs dump` folder: its plan sets")
    ap.add_argument("--split", type=int, default=4096, help="without --config-dir: the breakpoint of two ranges")
    ap.add_argument(
        "--kv-dtypes",
        type=kv_dtypes_arg,
        default=",".join(MLA_POOL_FORMATS),
        help="the formats to run, comma-separated (default: every one the kernel reads that SGLang's MLA pool "
        "holds; an e4m3 one on an e4m3 pool)",
    )
    args = ap.parse_args()

    from verify_tuner.kernels import runtime

    limits = runtime.read_limits(0)
    rows = []
    source = str(args.config_dir) if args.config_dir else f"two ranges split at {args.split}"
    args.out.mkdir(parents=True, exist_ok=True)
    over = []
    for kv in args.kv_dtypes:
        dtype = getattr(torch, FORMATS[kv].pool_dtypes[-1])  # the format's torch pool (e4m3: float8_e4m3fn)
        pick = range_picker(limits, args.config_dir, args.split, kv)
        for bs in (int(b) for b in args.batches.split(",")):
            width = schedules(bs, 4096)[1].width
            layers = max(2, -(-3 * limits.l2_bytes // ((bs + 4) * width * 576 * 2)))
            try:
                row = loop(bs, layers=layers, pick_ranges=pick, pool_dtype=dtype, kv_dtype=kv)
            except NotImplementedError as exc:  # the kernel cannot run this format here (e.g. e4m3 MMAs on an A100)
                row = {
                    "batch": bs,
                    "pool dtype": str(dtype).removeprefix("torch."),
                    "kv_dtype": kv,
                    "not run": str(exc),
                }
            rows.append(row)
            if row.get(f"rel err max <= {GATE:g}") is False:
                over.append(f"{kv} B={bs}: {row['rel err max']:.2e} at worst, {row['steps over the gate']} steps over")
            print(json.dumps({k: v for k, v in row.items() if k != "timed"}), flush=True)
            torch.cuda.empty_cache()
            # written after every row: a call cut at its time limit keeps the rows it finished
            doc = {"device": limits.name, "date": dt.date.today().isoformat(), "ranges from": source, "rows": rows}
            (args.out / f"engine_loop_{limits.arch}.json").write_text(json.dumps(doc, indent=1))
    if over:
        raise SystemExit(f"relative error above {GATE:g} (the rows are saved): " + "; ".join(over))


if __name__ == "__main__":
    main()
