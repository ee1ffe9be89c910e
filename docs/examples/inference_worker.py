"""How an inference worker uses the sidecar: fetch the table once, look the config up every
decode step, and keep one CUDA graph per distinct config (the prefix grows each step, so the
config changes only when the prefix crosses a bucket edge).

    python docs/examples/inference_worker.py --url http://127.0.0.1:8177 --device h200 --steps 2000

Without a GPU it runs the lookup loop and prints which graph each step would replay.
"""

from __future__ import annotations

import argparse
import time

from verify_tuner.engine.client import ConfigClient


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--url",
        default=None,
        help="sidecar (default: VERIFY_TUNER_URL; VERIFY_TUNER_CONFIG_DIR "
        "names a folder of `tuner configs dump` files)",
    )
    ap.add_argument("--device", default="h200")
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--q-len", type=int, default=9)
    ap.add_argument("--prefix", type=int, default=40_000, help="prefix length at the first step")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=1, help="requests verified per step")
    args = ap.parse_args()

    client = ConfigClient(args.url, H=args.H, q_len=args.q_len, device=args.device)
    print(f"config table from {client.fetch()}: {client.reason}")

    graphs: dict[object, str] = {}  # config -> captured graph (here: a label)

    def graph_for(cfg):  # type: ignore[no-untyped-def]
        if cfg not in graphs:
            # On a GPU: build verify_tuner.kernels.launch.VerifyAttention(cfg, ...) once, capture its launch on
            # a side stream with torch.cuda.graph (see tests/kernels/test_kernel_gpu.py), keep it.
            graphs[cfg] = f"graph#{len(graphs)} {cfg}"
            print(f"captured {graphs[cfg]}")
        return graphs[cfg]

    t0 = time.perf_counter()
    prefixes = [args.prefix] * args.batch  # one prefix length per request of the step
    for step in range(args.steps):
        # a batch is looked up by its longest request and its size (docs/batching.md)
        cfg = client.lookup(max(prefixes), batch=len(prefixes))  # no I/O: safe on the decode hot path
        graph_for(cfg)  # .replay() on a GPU
        i = step % len(prefixes)
        prefixes[i] += args.q_len  # accepted tokens grow a prefix; a constant stands in here
    dt = (time.perf_counter() - t0) / args.steps * 1e6
    print(f"{args.steps} steps, {len(graphs)} graph(s), {dt:.2f} us per lookup+select")


if __name__ == "__main__":
    main()
