"""Where the time goes, without hardware counters: time the best configs of the kernel
benchmark as a whole, partial kernel alone, and partial variants that leave one phase out
(compiled with -DVA_PROFILE_SKIP_*; their output is wrong by design and never checked).

    python3 bench/profile_kernel.py --bench bench/results/kernel_sm_90.json --out bench/results
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.config import KernelConfig

SHAPES = [(8, 9, 46000), (64, 9, 46000), (8, 1, 131072)]
VARIANTS = [("partial+reduce", (), True), ("partial only", (), False),
            ("partial, no QK", ("-DVA_PROFILE_SKIP_QK",), False),
            ("partial, no softmax", ("-DVA_PROFILE_SKIP_SOFTMAX",), False),
            ("partial, no PV", ("-DVA_PROFILE_SKIP_PV",), False),
            ("partial, loads only", ("-DVA_PROFILE_SKIP_QK", "-DVA_PROFILE_SKIP_SOFTMAX", "-DVA_PROFILE_SKIP_PV"),
             False)]


def parse_cfg(text: str) -> KernelConfig:
    return KernelConfig.from_params(dict(kv.split("=") for kv in text.split()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--cache", default="/tmp/va-cache")
    args = ap.parse_args()
    import pycuda.autoprimaryctx  # noqa: F401
    import torch

    from kernels.launch import VerifyAttention
    from kernels.limits import read_device_limits
    from kernels.timing import rotating_inputs, time_launches

    limits = read_device_limits(0)
    bench = json.loads(args.bench.read_text())
    bw = bench["copy_bw_GBps"] * 1e9
    best = {(r["H"], r["Q"], r["prefix"]): parse_cfg(r["best"]) for r in bench["rows"]}
    lines = [f"# Kernel phase profile — {limits.name} ({limits.arch}), {dt.date.today().isoformat()}", "",
             "Median µs (CUDA events, inputs rotated past the L2) of the benchmark's best config and of variants "
             "that leave a phase out. Achieved = KV+q+o bytes / time; the copy bandwidth is "
             f"{bw / 1e9:.0f} GB/s.", "",
             "| H | Q | prefix | config | variant | µs | achieved GB/s |", "|---|---|---|---|---|---|---|"]
    for H, Q, P in SHAPES:
        cfg = best.get((H, Q, P))
        if cfg is None:
            continue
        sets = rotating_inputs(prefix_lens=[P], q_len=Q, H=H, l2_bytes=limits.l2_bytes, seed=1)
        out = torch.empty(1, Q, H, 512, dtype=torch.bfloat16, device="cuda")
        nbytes = (P + Q) * 576 * 2 + Q * H * 1088 * 2
        for name, flags, full in VARIANTS:
            va = VerifyAttention(cfg, H=H, q_len=Q, limits=limits, max_batch=1, cache_dir=Path(args.cache),
                                 extra_flags=flags)

            def launch(k, va=va, full=full):
                va.run(sets[k], out, reduce=full)

            t = time_launches(launch, len(sets), reps=60)
            lines.append(f"| {H} | {Q} | {P} | {cfg} | {name} | {t.median_us:.1f} | {nbytes / t.median_us / 1e3:.0f} |")
            print(lines[-1], flush=True)
        sets = []  # free the inputs before the next shape
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"kernel_profile_{limits.arch}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
