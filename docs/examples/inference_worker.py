"""How an inference worker uses the config table: fetch it once at startup, capture one CUDA graph
per batch size with that batch size's graph plan (the kernel follows every prefix inside the graph),
and, where a step runs without a graph, look its config up by the batch's longest request.

    python docs/examples/inference_worker.py --url http://127.0.0.1:8177 --device h200 --batch-sizes 1,8,32
    python docs/examples/inference_worker.py --device h200 --kv-dtype fp8_e4m3   # an e4m3 cache's table

Without a GPU it prints what each graph would capture and runs the lookup loop of graph-less steps.
On a GPU the graphs are verify_tuner.engine.adapter.VerifyBackend's (docs/integration.md), which
launches through the torch op from a cubin bundle: no nvcc on the inference host.
"""

from __future__ import annotations

import argparse
import sys
import time

from verify_tuner.engine.client import ConfigClient
from verify_tuner.kernels.formats import KV_DTYPES


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--url",
        default=None,
        help="sidecar (default: VERIFY_TUNER_URL; VERIFY_TUNER_CONFIG_DIR names a folder of `tuner configs dump` files)",
    )
    ap.add_argument("--device", default="h200")
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--q-len", type=int, default=9)
    ap.add_argument("--kv-dtype", default="bf16", choices=KV_DTYPES, help="the KV cache's format (its own table)")
    ap.add_argument("--batch-sizes", default="1,8,32", help="the batch sizes the engine captures graphs for")
    ap.add_argument("--max-prefix", type=int, default=131_071, help="the longest prefix a request may reach")
    ap.add_argument("--prefix", type=int, default=40_000, help="prefix length at the first graph-less step")
    ap.add_argument("--steps", type=int, default=2000, help="graph-less steps to look up")
    args = ap.parse_args()
    try:
        sizes = [int(s) for s in args.batch_sizes.split(",")]
    except ValueError:
        ap.error(f"--batch-sizes must be integers separated by commas, got {args.batch_sizes!r}")

    client = ConfigClient(args.url, H=args.H, q_len=args.q_len, device=args.device, kv_dtype=args.kv_dtype)
    print(f"config table from {client.fetch()}: {client.reason}")
    if client.source == "none":  # an unknown device and no table: the engine keeps its own attention
        sys.exit(f"no verify-attention config for {args.device!r}: use the engine's own attention")

    # at capture time, once per batch size and prefix range: a step replays the range holding its
    # batch's longest prefix (the SGLang backend does this; one graph per batch size: graph_plan())
    for bs in sizes:
        ranges = client.graph_plans(bs, max_prefix=args.max_prefix)
        for i, choice in enumerate(ranges):
            start = choice.prefix_range[0] if i and choice.prefix_range else 0
            worst = max((r for _, _, r in choice.regrets), default=None)
            regret = f", worst regret {worst:.3f}x" if worst else ""
            print(f"graph for batch {bs} from prefix {start}: {choice.config} ({choice.source}{regret})")

    # a step without a graph: looked up by its longest request and its size (docs/batching.md)
    prefixes = [args.prefix] * sizes[-1]
    seen = set()
    t0 = time.perf_counter()
    for step in range(args.steps):
        seen.add(client.lookup(max(prefixes), batch=len(prefixes)))  # no I/O: safe on the hot path
        prefixes[step % len(prefixes)] += args.q_len  # accepted tokens grow a prefix; a constant stands in
    dt = (time.perf_counter() - t0) / max(args.steps, 1) * 1e6
    print(f"{args.steps} graph-less steps at batch {len(prefixes)}: {len(seen)} config(s), {dt:.2f} us per lookup")


if __name__ == "__main__":
    main()
