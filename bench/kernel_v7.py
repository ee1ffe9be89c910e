"""Kernel v7's targets on the local GPU in one call: every case of the kernel-v7 issue's table,
each config gated against the fp32 reference (on the dequantized cache for e4m3) before it is
timed, v7 and v6 A/B'd in the same call and the same process, CUDA-graph replays with inputs
rotated past the L2; an fp8 case's bf16 default of the same shape is timed in the same interleaved
rounds (its x_bf16: the issue's fp8 targets, robust to the clock drifting between cases). v6 is
compiled from its own source and launched through this tree's runtime: its signature is v7's
without the two trailing scale arguments, which the driver does not read.
Writes kernel_v7_<arch>.json (one row per case: case, kv format, mode, us, limit_us for that
format, v6_us, bf16_us and x_bf16 for fp8, TB/s, TFLOP/s, config) and a markdown table under --out.

    git show e88ba0d:kernels/csrc/verify_attention.cu > .v6/verify_attention.cu   # here; carry .v6
    python3 bench/kernel_v7.py --v6-source .v6/verify_attention.cu --out OUT [--quick]
    python3 bench/kernel_v7.py --quick --fp8 fp8_ds_mla --fp8-only --out OUT   # another fp8 format's cases

--fp8 names the format the fp8 cases read (fp8_e4m3 by default, the issue's); with another the
files are kernel_v7_<format>_<arch>.*, beside the table of record rather than over it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import compile_source
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels import formats
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.kernels.shapes import floor_bytes, flops

ANCHOR_BW = 4191e9  # the H200's measured copy bandwidth (../shared/anchors/h200.md): one figure everywhere
MMA_CEILING = 645e12  # mma.sync bf16 -> fp32 on the H200, same anchors
B32 = [20000 + round(50000 * i / 31) for i in range(32)]  # 20k..70k
#: (case, H, q_len, prefix lens, kv_dtype, device whose default config for that format is timed)
CASES = [
    ("H=8 q=9 P=46000", 8, 9, [46000], "bf16", "h200"),
    ("B=32 20k..70k", 8, 9, B32, "bf16", "h200"),
    ("H=64 q=9 P=46000", 64, 9, [46000], "bf16", "h200"),
    ("H=128 q=9 P=46000", 128, 9, [46000], "bf16", "h200"),
    ("H=8 q=9 P=0", 8, 9, [0], "bf16", "h200"),
    ("H=8 q=9 P=4096", 8, 9, [4096], "bf16", "h200"),
    ("H=8 q=1 P=131072", 8, 1, [131072], "bf16", "h200"),
    ("H=8 q=1 P=131072", 8, 1, [131072], "fp8_e4m3", "h200"),
    ("B=32 20k..70k", 8, 9, B32, "fp8_e4m3", "h200"),
    ("H=8 q=9 P=46000", 8, 9, [46000], "fp8_e4m3", "h200"),
    ("sm_120 template H=8 q=9 P=46000", 8, 9, [46000], "bf16", "rtx-pro-6000"),
    ("sm_120 template H=64 q=9 P=46000", 64, 9, [46000], "bf16", "rtx-pro-6000"),
    ("sm_120 template H=8 q=64 P=46000", 8, 64, [46000], "bf16", "rtx-pro-6000"),
]
#: v6's sm_120 defaults (its heuristic's choice for the RTX PRO 6000, as kernel_v7_sm_90.json of
#: 2026-12-05 recorded it): v6's side of the sm_120 template cases, v7's being today's heuristic.
V6_SM120 = {
    (8, 9): "NSPLIT=94 HT=4 TK=16 BLOCK=256 STAGES=2 QT=0 WR=4 WK=2 SF=0 PIPE=1",
    (64, 9): "NSPLIT=11 HT=4 TK=16 BLOCK=256 STAGES=2 QT=0 WR=4 WK=2 SF=0 PIPE=1",
    (8, 64): "NSPLIT=8 HT=1 TK=16 BLOCK=256 STAGES=2 QT=32 WR=4 WK=2 SF=0 PIPE=1",
}
#: bench/bench_kernel.py's 40 shapes: no bf16 shape slower than v6 by more than 3 %
REGRESSION = [(H, Q, P) for H in (8, 16, 64, 128) for Q in (1, 9) for P in (1024, 4096, 16384, 46000, 131072)]


def compile_v6(source: Path, cfg, q_len: int, arch: str, folder: Path) -> bytes:
    """The v6 kernel at `cfg`: this tree's #defines (v6 ignores KV_FMT) over v6's source."""
    return compile_source(source, cfg, q_len, arch, folder).read_bytes()


def v6_config(device: str, H: int, q: int) -> KernelConfig | None:
    """v6's own default where its heuristic chose another than v7's (the sm_120 template), else None."""
    if device != "rtx-pro-6000":
        return None
    return KernelConfig.from_params(dict(kv.split("=") for kv in V6_SM120[(H, q)].split()))


def launchers(case, *, limits, cache: Path, v6_source: Path | None, tmp: Path, stream):
    """{label: (launch(k), config)} of the case's v7 config and, for bf16, v6's, each gated first."""
    import torch
    from benchlib import checked_launcher
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.reference import reference
    from verify_tuner.kernels.runtime import CubinKernels
    from verify_tuner.kernels.timing import rotating_inputs

    name, H, q, lens, kv, device = case
    # each format at its own default: what an engine reading that cache is served
    cfg = heuristic_config(known_device(device), H=H, q_len=q, prefix=max(lens), batch=len(lens), kv_dtype=kv)
    sets = rotating_inputs(
        prefix_lens=lens, q_len=q, H=H, l2_bytes=limits.l2_bytes, seed=H + q + len(lens), kv_dtype=kv
    )
    ref = reference(sets[0])[0]
    out = torch.empty(len(lens), q, H, 512, dtype=torch.bfloat16, device="cuda")
    B = len(lens)
    va = VerifyAttention(cfg, H=H, q_len=q, limits=limits, max_batch=B, cache_dir=cache, kv_dtype=kv)
    got = {"v7": (checked_launcher(va, sets, out, ref, f"v7 {name} {kv}", stream=stream), cfg)}
    if kv == "bf16" and v6_source is not None:
        old = v6_config(device, H, q) or cfg
        v6 = VerifyAttention(old, H=H, q_len=q, limits=limits, max_batch=B, cache_dir=cache)
        v6.kernels = CubinKernels(compile_v6(v6_source, old, q, limits.arch, tmp), v6.spec, sm_count=limits.sm_count)
        got["v6"] = (checked_launcher(v6, sets, out, ref, f"v6 {name}", stream=stream), old)
    return got, sets


def row_of(case, us: dict, cfg, bw: float, v6cfg=None) -> dict:
    name, H, q, lens, kv, device = case
    nbytes, nflop = floor_bytes(lens, q_len=q, H=H, kv_dtype=kv), flops(lens, q_len=q, H=H)
    limit = max(nbytes / ANCHOR_BW, nflop / MMA_CEILING) * 1e6
    fmt = formats.FORMATS[kv]
    return {
        "case": name,
        "kv_format": kv,
        "mode": {"bf16": "bf16", "f16": "dequant", "e4m3": "fp8_qk"}[fmt.mma],
        "config_for": device,
        "us": round(us["v7"], 2),
        "limit_us": round(limit, 2),
        "x_limit": round(us["v7"] / limit, 3),
        "v6_us": round(us["v6"], 2) if "v6" in us else None,
        "v6_config": str(v6cfg) if v6cfg is not None else None,
        "TBps": round(nbytes / us["v7"] / 1e6, 3),
        "TFLOPs": round(nflop / us["v7"] / 1e6, 1),
        "config": str(cfg),
        "measured_copy_bw_GBps": round(bw / 1e9),
        # an fp8 row: the same shape's bf16 default timed in the same interleaved rounds, and the ratio
        "bf16_us": round(us["bf16"], 2) if "bf16" in us else None,
        "x_bf16": round(us["v7"] / us["bf16"], 3) if "bf16" in us else None,
    }


def cases_of(quick: bool, fp8: str, fp8_only: bool, names: str | None) -> list[tuple]:
    """The cases a call times: the issue's (the fp8 ones reading `fp8`), then, unless quick, the 40
    regression shapes; only the fp8 cases with fp8_only; only those whose name holds one of the
    comma-separated `names`. ValueError naming what matched nothing."""
    cases = [(*c[:4], fp8 if c[4] == "fp8_e4m3" else c[4], c[5]) for c in CASES]
    if not quick and not fp8_only:
        cases += [(f"H={h} q={q} P={p}", h, q, [p], "bf16", "h200") for h, q, p in REGRESSION]
    if fp8_only:
        cases = [c for c in cases if c[4] != "bf16"]
    if names:
        cases = [c for c in cases if any(part in c[0] for part in names.split(","))]
    if not cases:
        raise ValueError(f"--cases {names!r} names none of the cases")
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument("--v6-source", type=Path, help="v6's verify_attention.cu, for the same-call A/B (omit: v7 alone)")
    ap.add_argument("--quick", action="store_true", help="the cases alone, not the 40-shape regression sweep")
    ap.add_argument("--cases", help="only the cases whose name contains one of these, comma-separated")
    fp8s = [n for n, f in formats.FORMATS.items() if f.element == "e4m3" and f.kernel_reads]
    ap.add_argument("--fp8", default="fp8_e4m3", choices=fp8s, help="the format the fp8 cases read")
    ap.add_argument("--fp8-only", action="store_true", help="only the fp8 cases (each beside bf16 in its rounds)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache")))
    args = ap.parse_args()
    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as cuda
    import torch
    from benchlib import interleaved_medians
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.timing import copy_bandwidth

    try:
        cases = cases_of(args.quick, args.fp8, args.fp8_only, args.cases)
    except ValueError as exc:
        ap.error(str(exc))
    limits, stream, bw = read_device_limits(0), cuda.Stream(), copy_bandwidth()
    rows = []
    with tempfile.TemporaryDirectory(prefix="v6-") as tmp:
        for case in cases:
            got, sets = launchers(
                case, limits=limits, cache=args.cache, v6_source=args.v6_source, tmp=Path(tmp), stream=stream
            )
            counts = dict.fromkeys(got, len(sets))
            if case[4] != "bf16":  # the fp8 targets are ratios to bf16 v7: both in the same rounds
                bf16_case = (case[0], *case[1:4], "bf16", case[5])
                bf16, bf16_sets = launchers(
                    bf16_case, limits=limits, cache=args.cache, v6_source=None, tmp=Path(tmp), stream=stream
                )
                got["bf16"], counts["bf16"] = bf16["v7"], len(bf16_sets)
                del bf16_sets  # the launcher holds its own sets
            us = interleaved_medians(
                {k: f for k, (f, _) in got.items()}, counts, rounds=args.rounds, reps=20, stream=stream
            )
            rows.append(row_of(case, us, got["v7"][1], bw, got["v6"][1] if "v6" in got else None))
            r = rows[-1]
            vs = (
                f"v6 {r['v6_us'] or float('nan'):8.1f}"
                if "bf16" not in us
                else f"{r['x_bf16']:.3f}x bf16's {us['bf16']:.1f}"
            )
            print(f"{r['case']:36s} {r['kv_format']:9s} v7 {r['us']:8.1f} us  {vs}  "
                  f"limit {r['limit_us']:7.1f} ({r['x_limit']:.2f}x)  {r['config']}", flush=True)  # fmt: skip
            del sets
            torch.cuda.empty_cache()
    write(args.out, limits, rows, "kernel_v7" if args.fp8 == "fp8_e4m3" else f"kernel_v7_{args.fp8}")


def write(out: Path, limits, rows: list[dict], stem: str = "kernel_v7") -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {"device": limits.name, "arch": limits.arch, "date": dt.date.today().isoformat(),
            "bandwidth_for_limits_GBps": ANCHOR_BW / 1e9, "rows": rows}  # fmt: skip
    (out / f"{stem}_{limits.arch}.json").write_text(json.dumps(meta, indent=1) + "\n")
    # the limits use the H200's anchors on every device, so a table from another GPU says so
    measured = ", ".join(str(m) for m in sorted({r["measured_copy_bw_GBps"] for r in rows}))
    basis = (f"Limits: the H200's anchors on every device ({ANCHOR_BW / 1e9:.0f} GB/s copy bandwidth, "
             f"{MMA_CEILING / 1e12:.0f} TFLOP/s mma.sync); this GPU's copy bandwidth, measured in this call: "
             f"{measured} GB/s.")  # fmt: skip
    lines = [f"# Kernel v7 on {limits.name} ({meta['date']})", "", basis, "",
             "| case | kv | v7 µs | v6 µs | bf16 v7 µs, same rounds (× it) | limit µs | × limit | TB/s | TFLOP/s | config |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        vs_bf16 = f"{r['bf16_us']} ({r['x_bf16']}×)" if r.get("bf16_us") is not None else "—"
        lines.append(f"| {r['case']} | {r['kv_format']} | {r['us']} | {r['v6_us'] or '—'} | {vs_bf16} | "
                     f"{r['limit_us']} | {r['x_limit']} | {r['TBps']} | {r['TFLOPs']} | `{r['config']}` |")  # fmt: skip
    (out / f"{stem}_{limits.arch}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
