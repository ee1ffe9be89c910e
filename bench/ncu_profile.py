"""Launch one kernel config a few times at one shape, for Nsight Compute to profile
(bench/run_ncu.sh wraps it). Plain launches, inputs rotated past the L2 like the benchmark;
the first launches warm the module, the profiler picks one by --launch-skip.

    python3 bench/ncu_profile.py --shape 8:9:46000 [--config "NSPLIT=132 HT=8 ..."] [--flags -DVA_...] [--kv-dtype fp8_e4m3]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.formats import readable
from verify_tuner.kernels.shapes import D_V


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, help="H:Q:P")
    ap.add_argument("--config", help="constants as 'NSPLIT=.. HT=..' (default: the heuristic's)")
    ap.add_argument("--flags", default="", help="extra nvcc flags, space-separated")
    ap.add_argument("--kv-dtype", default="bf16", help="the cache format (kernels/formats.py; default bf16)")
    ap.add_argument("--launches", type=int, default=6)
    ap.add_argument("--cache", default=os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache"))
    args = ap.parse_args()
    try:
        readable(args.kv_dtype)
    except InvalidConfig as exc:
        ap.error(str(exc))

    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as cuda
    import torch
    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.timing import rotating_inputs

    H, Q, P = (int(x) for x in args.shape.split(":"))
    limits = read_device_limits(0)
    cfg = (
        KernelConfig.from_params(dict(kv.split("=") for kv in args.config.split()))
        if args.config
        else heuristic_config(limits, H=H, q_len=Q, prefix=P, kv_dtype=args.kv_dtype)
    )
    va = VerifyAttention(
        cfg,
        H=H,
        q_len=Q,
        limits=limits,
        max_batch=1,
        cache_dir=Path(args.cache),
        extra_flags=tuple(args.flags.split()),
        kv_dtype=args.kv_dtype,
    )
    sets = rotating_inputs(prefix_lens=[P], q_len=Q, H=H, l2_bytes=limits.l2_bytes, seed=1, kv_dtype=args.kv_dtype)
    out = torch.empty(1, Q, H, D_V, dtype=torch.bfloat16, device="cuda")
    stream = cuda.Stream()
    for k in range(args.launches):
        va.run(sets[k % len(sets)], out, stream=stream)
    stream.synchronize()
    print(f"profiled H={H} Q={Q} P={P} {args.kv_dtype} {cfg} flags={args.flags!r} regs={va.report.get('registers')}")


if __name__ == "__main__":
    main()
