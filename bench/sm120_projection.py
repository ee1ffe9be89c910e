"""A projection of the sm_120 defaults' time on the RTX PRO 6000 from what the H200 measured of the
same configs (the sm_120 template rows of bench/results/kernel_v7_sm_90.json), with its model
stated. Nothing here is measured on an sm_120: it bounds what one should expect there, and says
which term binds. No GPU needed.

    python3 bench/sm120_projection.py --out OUT [--results bench/results/kernel_v7_sm_90.json]

The model (every constant below is an input, stated with its source):
- memory floor: the bytes moved once over the RTX PRO 6000's 1792 GB/s times the fraction of its
  bandwidth the H200 reaches in a copy (4191 of 4800 GB/s: an assumption that GDDR7 and HBM3e
  reach the same share);
- tensor floor: the FLOP over 503.8 TFLOP/s dense bf16 (fp8: twice that), spread evenly over the
  blocks of one wave;
- issue time: the config's block runs the same instruction stream on both GPUs (same source and
  constants; the cubins differ), at the same instructions a clock, so a block's time scales with the
  SM clock, 1.98 GHz on the H200 and about 2.6 GHz on the RTX PRO 6000 (125 TFLOP/s fp32 over
  24 064 cores). The H200 ran the sm_120 grid (its NSPLIT is for 188 SMs) on 132 SMs: with more
  blocks than SMs, some SMs held two blocks at once, and the block's own time lies between half
  the measured time (the two shared the SM's issue slots perfectly) and all of it (they overlapped
  perfectly): a range, not a point;
- a block alone on each of 188 SMs (every sm_120 default is one wave), the projection is the
  largest of the three terms at each end of the range.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify_tuner.kernels.abi import LaunchSpec
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.kernels.shapes import floor_bytes, flops
from verify_tuner.kernels.validate import smem_bytes

RESULTS = Path(__file__).resolve().parent / "results" / "kernel_v7_sm_90.json"
H200_SMS, H200_CLOCK_GHZ = 132, 1.98
H200_COPY_FRACTION = 4191 / 4800  # measured copy bandwidth (../shared/anchors/h200.md) over HBM3e's spec
SM120_BW_GBPS, SM120_CLOCK_GHZ = 1792, 2.6
SM120_BF16_TFLOPS = 503.8  # dense bf16 (mma.sync is sm_120's tensor path); e4m3 MMAs twice that


def blocks(cfg: KernelConfig, H: int, q_len: int) -> int:
    x, y, _ = LaunchSpec(cfg, H, q_len).partial_grid()
    return x * y


def project(row: dict, H: int, q_len: int, lens: list[int]) -> dict:
    """The projection of one sm_120 template row (its config timed on the H200)."""
    target = known_device("rtx-pro-6000")
    cfg = KernelConfig.from_params(dict(kv.split("=") for kv in row["config"].split()))
    kv = row["kv_format"]
    grid = blocks(cfg, H, q_len)
    assert grid <= target.sm_count, f"{row['case']}: {grid} blocks is more than one wave on sm_120"
    per_sm = min(-(-grid // H200_SMS), known_device("h200").smem_per_sm // smem_bytes(cfg, q_len, kv))
    t_h200 = row["us"]
    block_lo, block_hi = (t_h200 / per_sm, t_h200) if per_sm > 1 else (t_h200, t_h200)
    clock = H200_CLOCK_GHZ / SM120_CLOCK_GHZ
    issue = (block_lo * clock, block_hi * clock)
    memory = floor_bytes(lens, q_len=q_len, H=H, kv_dtype=kv) / (SM120_BW_GBPS * 1e9 * H200_COPY_FRACTION) * 1e6
    tflops = SM120_BF16_TFLOPS * (2 if kv.endswith("_qk") else 1)
    tensor = flops(lens, q_len=q_len, H=H) / grid / (tflops * 1e12 / target.sm_count) * 1e6
    lo, hi = (max(memory, tensor, t) for t in issue)
    binds = ["memory" if t == memory else "tensor" if t == tensor else "issue" for t in (lo, hi)]
    return {
        "case": row["case"],
        "kv_format": kv,
        "config": row["config"],
        "h200_us": t_h200,
        "blocks": grid,
        "h200_blocks_per_sm": per_sm,
        "issue_us": [round(t, 1) for t in issue],
        "memory_floor_us": round(memory, 1),
        "tensor_floor_us": round(tensor, 1),
        "projected_us": [round(lo, 1), round(hi, 1)],
        "x_memory_floor": [round(lo / memory, 2), round(hi / memory, 2)],
        "binds": binds,
    }


#: the sm_120 template cases of kernel_v7.py: case name -> (H, q_len, prefix lens)
SHAPES = {
    "sm_120 template H=8 q=9 P=46000": (8, 9, [46000]),
    "sm_120 template H=64 q=9 P=46000": (64, 9, [46000]),
    "sm_120 template H=8 q=64 P=46000": (8, 64, [46000]),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--results", type=Path, default=RESULTS, help="a kernel_v7.py result with the sm_120 template rows")
    args = ap.parse_args()
    doc = json.loads(args.results.read_text())
    rows = [project(r, *SHAPES[r["case"]]) for r in doc["rows"] if r["case"] in SHAPES]
    if not rows:
        ap.error(f"{args.results} has no sm_120 template rows ({', '.join(SHAPES)})")
    source = f"{args.results.name} ({doc['device']}, {doc['date']})"
    out = {"date": dt.date.today().isoformat(), "source": source, "model": __doc__.split("\n\n", 2)[2], "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sm120_projection.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = [
        f"# sm_120 defaults projected to the RTX PRO 6000 from {source} — a model, not a measurement",
        "",
        "`python3 bench/sm120_projection.py --out DIR`; the model is in the script's docstring. Ranges: a block's",
        "time on the H200 was between half and all of the measured time where two blocks shared an SM.",
        "",
        (
            "| case | kv | H200 µs (sm_120 grid) | blocks | H200 blocks/SM | issue µs | memory floor µs "
            "| tensor floor µs | projected µs | × memory floor | binds |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['kv_format']} | {r['h200_us']} | {r['blocks']} | {r['h200_blocks_per_sm']} | "
            f"{r['issue_us'][0]}-{r['issue_us'][1]} | {r['memory_floor_us']} | {r['tensor_floor_us']} | "
            f"{r['projected_us'][0]}-{r['projected_us'][1]} | {r['x_memory_floor'][0]}-{r['x_memory_floor'][1]} | "
            f"{' / '.join(dict.fromkeys(r['binds']))} |"
        )
        print(lines[-1])
    (args.out / "sm120_projection.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
