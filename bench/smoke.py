"""One gated launch of this GPU's default per cache format, before a device call's longer work.

A kernel that deadlocks (a barrier or slot index gone wrong) hangs every benchmark and test after
it, so a call without this check spends its whole limit and returns nothing; run it first, under
`timeout -s KILL`, and stop the call when it fails:

    timeout -s KILL 240 python3 bench/smoke.py [--kv-dtype bf16 --kv-dtype fp8_e4m3]

Each format runs its default at H=8 q=9 and at H=64 q=9 (different splits), over a ragged batch
with an empty prefix, through the benchmarks' gate (benchlib.checked_launcher: poisoned output,
fp32 reference). Prints one line a case and exits 0; a wrong result exits 1 naming the case.
Writes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.formats import KV_DTYPES

PREFIXES = [4096, 1000, 0]  # ragged, with a request that has no prefix yet
SHAPES = [(8, 9), (64, 9)]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv-dtype", action="append", choices=KV_DTYPES, help="a cache format (repeatable; default bf16)")
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache")))
    args = ap.parse_args(argv)
    args.kv_dtype = args.kv_dtype or ["bf16"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as cuda
    import torch
    from benchlib import checked_launcher
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.reference import make_inputs, reference

    limits, stream = read_device_limits(0), cuda.Stream()
    for kv in args.kv_dtype:
        for H, q in SHAPES:
            t0 = time.perf_counter()
            cfg = heuristic_config(limits, H=H, q_len=q, prefix=max(PREFIXES), batch=len(PREFIXES), kv_dtype=kv)
            inp = make_inputs(prefix_lens=PREFIXES, q_len=q, H=H, seed=H + q, kv_dtype=kv)
            va = VerifyAttention(cfg, H=H, q_len=q, limits=limits, max_batch=len(PREFIXES), cache_dir=args.cache,
                                 kv_dtype=kv)  # fmt: skip
            out = torch.empty(len(PREFIXES), q, H, 512, dtype=torch.bfloat16, device="cuda")
            # a wrong result ends the process with "WRONG <what>: rel err ..." and exit 1
            checked_launcher(va, [inp], out, reference(inp)[0], f"{kv} H={H} q={q} {cfg}", stream=stream)
            print(f"{kv} H={H} q={q} prefixes {PREFIXES} {cfg}: ok ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
