"""A speculative-decoding engine's verify loop through the SGLang backend's own code path
(VerifyMLABackend, driven by its hooks in SGLang's order), per batch size {1, 8, 32}: 300 steps
of one CUDA graph captured at the first step (the runner's static buffers; the in-graph refill
and every layer's attention, a KV pool a layer so a step reads more than the L2 holds). Requests
join at P=0 and finish; their prefixes cross at least 3 prefix buckets; the draft trees are
EAGLE trees (topk 4) in SGLang's FULL_MASK layout, written where SGLang's draft stage writes
them. Every step one layer's output (in turn) is checked against fp32 attention computed from
SGLang's tensors; every 25th step the graph's replay is timed against a graph captured fresh at
that step. The loop runs for each KV pool dtype the kernel reads (bf16; fp8 once it reads fp8:
until then its row says why it did not run). One graph per batch size and prefix range comes
with graph plans per range (the tuner's key and store); this loop captures one per batch size.

    python3 bench/engine_loop.py --out $OUT      # on the GPU machine
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from pathlib import Path

import torch
from engine_steps import LoopEngine, Q, Schedule
from verify_tuner.engine.tree_masks import TreeMaskMode

STEPS, TIME_EVERY = 300, 25
#: Per batch size: (start prefixes, stop prefixes). Starts near bucket edges (724, 1024, 1448,
#: 2048, 2896); stops that some requests reach within the run, so new ones join at P=0.
BATCHES = {
    1: ([1000], [1700]),
    8: ([0, 700, 1000, 1400, 2000, 300, 50, 2800], [600, 1500, 1900, 2400, 2600, 900, 400, 3600]),
    32: ([90 * i for i in range(32)], [400 + 110 * i for i in range(32)]),
}


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


def capture(eng: LoopEngine) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor]]:
    """SGLang's capture: out_graph(in_capture=True), a warm-up on a side stream, then the graph."""
    eng.out_graph(in_capture=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eng.forward()  # loads the cubin, makes the op's plans
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        outs = eng.forward()
    return graph, outs


def loop(bs: int, *, layers: int, pick_config, pool_dtype: torch.dtype) -> dict:
    starts, stops = BATCHES[bs]
    sched = Schedule(starts, stops, seed=bs)
    eng = LoopEngine(sched, layers=layers, device="cuda", pick_config=pick_config, mode=TreeMaskMode.FULL_MASK,
                     pool_dtype=pool_dtype)  # fmt: skip
    eng.prepare()
    graph, outs = capture(eng)
    errors, timings, first = [], [], (min(sched.lens), max(sched.lens))
    for step in range(STEPS):
        eng.prepare()
        eng.out_graph()
        graph.replay()
        torch.cuda.synchronize()
        errors.append(eng.error(outs, step % layers))
        if step % TIME_EVERY == 0:
            kept = _timed(graph.replay) / layers
            fresh_graph, _ = capture(eng)
            eng.out_graph()
            fresh = _timed(fresh_graph.replay) / layers
            timings.append({"step": step, "prefix max": max(sched.lens), "kept us/layer": round(kept, 2),
                            "fresh us/layer": round(fresh, 2), "kept / fresh": round(kept / fresh, 3)})  # fmt: skip
            del fresh_graph
        sched.advance()
    return {
        "batch": bs, "pool dtype": str(pool_dtype).removeprefix("torch."), "layers": layers, "steps": STEPS,
        "config": str(pick_config(Q, bs)), "workspace MB": round(eng.backend.workspace_bytes() / 2**20, 2),
        "prefix first": list(first), "prefix last": [min(sched.lens), max(sched.lens)],
        "buckets visited": len(sched.buckets), "requests joined at P=0": sched.joined,
        "rel err max": max(e[0] for e in errors), "abs err max": max(e[1] for e in errors),
        "steps checked": len(errors), "timed": timings,
        "kept / fresh median": statistics.median(t["kept / fresh"] for t in timings),
        "kept / fresh max": max(t["kept / fresh"] for t in timings),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batches", default="1,8,32")
    args = ap.parse_args()

    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.kernels import runtime

    limits = runtime.read_limits(0)
    pick = lambda q, bs: heuristic_config(limits, H=8, q_len=q, prefix=4096, batch=bs)
    rows = []
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        for bs in (int(b) for b in args.batches.split(",")):
            width = max(BATCHES[bs][1]) + 16
            layers = max(2, -(-3 * limits.l2_bytes // ((bs + 4) * width * 576 * 2)))
            try:
                row = loop(bs, layers=layers, pick_config=pick, pool_dtype=dtype)
            except NotImplementedError as exc:  # the kernel does not read this pool yet
                row = {"batch": bs, "pool dtype": str(dtype).removeprefix("torch."), "not run": str(exc)}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "timed"}), flush=True)
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"device": limits.name, "date": dt.date.today().isoformat(), "rows": rows}
    (args.out / f"engine_loop_{limits.arch}.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
