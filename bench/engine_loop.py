"""A speculative-decoding engine's verify loop on the op, as SGLang runs it: per batch size one
CUDA graph holding every layer's verify attention (one KV pool a layer, so the step reads more
than the L2 holds), captured once at the first step; each step refills the shared metadata in
place (prefix lengths, pool rows of req_to_token, draft slots, packed tree mask) and replays it
while every request's prefix grows by what the step accepted, one request finishing and a new
one starting in its pool row. Per batch size: the step's graph time per layer (CUDA events
around the replay), the refill's time, the same shapes captured fresh at the last step (what a
graph captured there would cost), and the last step's error against the fp32 reference.

    python3 bench/engine_loop.py --out $OUT      # on the GPU machine
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from pathlib import Path

H, Q, STEPS = 8, 9, 24
BATCHES = {1: [46_000], 8: [100_000] + [2_000] * 7, 32: [20_000 + 1600 * i for i in range(32)]}


def _loop(torch, limits, lens0: list[int], layers_bytes: int) -> dict:
    from verify_tuner.engine.adapter import VerifyBackend
    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.kernels.reference import Inputs, random_tree_mask, reference, rel_error

    B, gen = len(lens0), torch.Generator().manual_seed(len(lens0))
    width = max(lens0) + STEPS * Q + 64
    slots = (B + 1) * width
    layers = max(2, -(-layers_bytes // (slots * 576 * 2)))
    pools = [torch.randn(slots, 576, device="cuda").to(torch.bfloat16) for _ in range(layers)]
    req_to_token = torch.randperm(slots, generator=gen)[: (B + 1) * width].view(B + 1, width).to(torch.int32).cuda()
    cfg = heuristic_config(limits, H=H, q_len=Q, prefix=max(lens0), batch=B)
    first = VerifyBackend(
        H=H, q_len=Q, kv_pool=pools[0], pick_config=lambda bs: cfg, max_batch=B, softmax_scale=576**-0.5,
        req_to_token=req_to_token,
    )  # fmt: skip
    backends = [first] + [first.for_layer(p) for p in pools[1:]]
    q = torch.randn(B * Q, H, 512, device="cuda").to(torch.bfloat16)
    q_pe = torch.randn(B * Q, H, 64, device="cuda").to(torch.bfloat16)
    outs = [torch.empty(B * Q, H, 512, dtype=torch.bfloat16, device="cuda") for _ in pools]
    lens, rows = list(lens0), list(range(B))

    def meta(step: int) -> dict:
        draft = torch.stack([req_to_token[r, n : n + Q] for r, n in zip(rows, lens)]).flatten()
        mask = torch.tensor([random_tree_mask(Q, gen) for _ in range(B)], dtype=torch.int32).to(torch.uint16)
        return {
            "seq_lens": torch.tensor(lens, device="cuda"),
            "req_pool_indices": torch.tensor(rows, device="cuda"),
            "out_cache_loc": draft,
            "tree_mask": mask.cuda(),
        }

    def capture():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for be, out in zip(backends, outs):
                be.forward(q, q_pe, out)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            for be, out in zip(backends, outs):
                be.forward(q, q_pe, out)
        return graph

    def timed(fn) -> float:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        return start.elapsed_time(stop) * 1000.0

    first.init_forward_metadata(B, **meta(0))
    graph, step_us, refill_us = capture(), [], []
    for step in range(STEPS):
        m = meta(step)
        refill_us.append(timed(lambda m=m: first.init_forward_metadata(B, **m)))
        step_us.append(timed(graph.replay) / layers)
        accepted = [int(torch.randint(1, Q + 1, (1,), generator=gen)) for _ in range(B)]
        lens = [n + a for n, a in zip(lens, accepted)]
        if step == STEPS // 2 and B > 1:  # request 1 finishes; a new one starts at P=0 in the spare row
            lens[1], rows[1] = 0, B
    fresh = capture()  # the same batch captured at the last step's prefixes
    fresh_us = statistics.median(timed(fresh.replay) / layers for _ in range(5))
    last = timed(graph.replay)
    inp = Inputs(
        q=torch.cat([q, q_pe], -1).view(B, Q, H, 576), kv=pools[-1], prefix_indices=req_to_token,
        prefix_indptr=first.buf.kv_indptr[: B + 1].clone(), draft_indices=first.buf.draft[:B].clone(),
        tree_mask=first.buf.mask[:B].view(torch.int16).to(torch.int64) & 0xFFFF, scale=576**-0.5,
        prefix_rows=first.buf.rows[:B].clone(),
    )  # fmt: skip
    err = rel_error(outs[-1].view(B, Q, H, 512), reference(inp)[0])
    return {
        "batch": B,
        "layers": layers,
        "steps": STEPS,
        "config": str(cfg),
        "prefix first": [min(lens0), max(lens0)],
        "prefix last": [min(lens), max(lens)],
        "step us per layer median": round(statistics.median(step_us), 2),
        "step us per layer p90": round(sorted(step_us)[int(0.9 * len(step_us))], 2),
        "refill us median": round(statistics.median(refill_us), 2),
        "fresh capture at the last step us per layer": round(fresh_us, 2),
        "last replay us": round(last, 2),
        "rel err last step": err,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import pycuda.autoprimaryctx  # noqa: F401  (the op and torch share the primary context)
    import torch
    from verify_tuner.kernels.limits import read_device_limits

    limits = read_device_limits(0)
    rows = []
    for lens0 in BATCHES.values():
        row = _loop(torch, limits, lens0, layers_bytes=3 * limits.l2_bytes)
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"device": limits.name, "date": dt.date.today().isoformat(), "rows": rows}
    (args.out / f"engine_loop_{limits.arch}.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
