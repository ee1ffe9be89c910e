"""Structure sweep on the local GPU: for the issue's target shapes, time a list of kernel
structures (ring depth, QK warp grid, prefetch distance, row tile, head tile, NSPLIT) as CUDA-graph
replays with inputs rotated past the L2, each gated against the fp32 reference first. Writes
JSON and a markdown table; optionally a phase split of the fastest config at one shape.

    python3 bench/sweep_structures.py --out OUT [--shapes 8:9:46000,8:1:131072] \
        [--configs plan.json] [--variant l2hint=-DVA_CP_L2_256B] [--layouts scattered,contiguous] \
        [--phases 8:9:46000,64:9:46000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify_tuner.kernels.build import precompile
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.shapes import floor_bytes, flops
from verify_tuner.kernels.validate import check

TARGETS = [(8, 9, 46000), (16, 9, 46000), (64, 9, 46000), (128, 9, 46000), (8, 1, 131072), (8, 9, 4096)]
# (TK, BLOCK, STAGES, WR, WK, PIPE) per row count class
COMPUTE = [
    (32, 256, 2, 2, 4, 1),
    (32, 256, 2, 2, 4, 0),
    (32, 256, 3, 2, 2, 1),
    (32, 256, 3, 2, 2, 0),
    (32, 256, 2, 4, 2, 1),
    (16, 256, 4, 2, 4, 1),
    (32, 256, 4, 1, 4, 1),
    (16, 256, 2, 2, 4, 1),
]
BANDWIDTH = [
    (32, 256, 2, 1, 4, 1),
    (32, 256, 2, 1, 4, 0),
    (32, 256, 3, 1, 4, 1),
    (32, 256, 4, 1, 4, 0),
    (16, 128, 3, 1, 4, 1),
    (16, 128, 4, 1, 4, 1),
    (64, 256, 2, 1, 2, 1),
    (32, 128, 3, 1, 2, 1),
]
PHASES = [
    ("whole", (), True),
    ("partial only", (), False),
    ("no QK", ("-DVA_PROFILE_SKIP_QK",), False),
    ("no softmax", ("-DVA_PROFILE_SKIP_SOFTMAX",), False),
    ("no PV", ("-DVA_PROFILE_SKIP_PV",), False),
    ("loads only", ("-DVA_PROFILE_SKIP_QK", "-DVA_PROFILE_SKIP_SOFTMAX", "-DVA_PROFILE_SKIP_PV"), False),
    ("no KV loads", ("-DVA_PROFILE_SKIP_LOADS",), False),
    ("empty partial", ("-DVA_PROFILE_EMPTY",), False),
    ("empty pair", ("-DVA_PROFILE_EMPTY",), True),
]


def candidates(limits, H: int, Q: int, P: int) -> list[KernelConfig]:
    """Structures worth timing at this shape, each with its one-wave NSPLIT (some also with two)."""
    if Q == 1:
        plan = [(min(8, H), 0, BANDWIDTH, 2)]
    elif P >= 16384:
        plan = [(8, 0, COMPUTE, 3), (8, 5, COMPUTE[6:], 1), (4, 0, COMPUTE[6:] + COMPUTE[:2], 2)]
    else:
        plan = [
            (8, 0, COMPUTE[:4], 4),
            (4, 0, COMPUTE[6:] + COMPUTE[:2], 4),
            (2, 0, BANDWIDTH[1:4], 3),
            (1, 0, BANDWIDTH[1:4], 3),
        ]
    out: set[KernelConfig] = set()
    for ht, qt, structs, n_two_wave in plan:
        if H % ht:
            continue
        groups = H // ht * -(-Q // (qt or Q))
        for i, (tk, block, stages, wr, wk, pipe) in enumerate(structs):
            for k in (1, 2) if i < n_two_wave else (1,):
                ns = max(1, limits.sm_count * k // groups)
                cfg = KernelConfig(nsplit=ns, ht=ht, tk=tk, block=block, stages=stages, qt=qt, wr=wr, wk=wk, pipe=pipe)
                if check(cfg, limits, H=H, q_len=Q) is None:
                    out.add(cfg)
    return sorted(out)


def parse_cfg(text: str) -> KernelConfig:
    return KernelConfig.from_params(dict(kv.split("=") for kv in text.split()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument("--shapes", default=",".join(f"{h}:{q}:{p}" for h, q, p in TARGETS))
    ap.add_argument("--configs", type=Path, help='JSON {"H:Q:P": ["NSPLIT=.. HT=.. ...", ...]} instead of the plan')
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="also time every config built with these nvcc flags, e.g. l2hint=-DVA_CP_L2_256B",
    )
    ap.add_argument("--layouts", default="scattered", help="slot layouts, comma-separated (scattered,contiguous)")
    ap.add_argument("--phases", default="", help="shapes H:Q:P (comma-separated) to split into phases at their best")
    ap.add_argument("--cache", default=os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache"))
    ap.add_argument("--tag", default="sweep")
    args = ap.parse_args()

    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as cuda
    import torch
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.reference import reference
    from verify_tuner.kernels.timing import copy_bandwidth, rotating_inputs

    limits = read_device_limits(0)
    if args.configs:
        given = json.loads(args.configs.read_text())
        plans = {tuple(int(x) for x in k.split(":")): [parse_cfg(c) for c in v] for k, v in given.items()}
    else:
        shapes = [tuple(int(x) for x in s.split(":")) for s in args.shapes.split(",")]
        plans = {s: candidates(limits, *s) for s in shapes}
    variants = {"base": ()} | {v.split("=", 1)[0]: tuple(v.split("=", 1)[1].split()) for v in args.variant}
    cache = Path(args.cache)
    for q in sorted({s[1] for s in plans}):
        cfgs = sorted({c for s, cs in plans.items() if s[1] == q for c in cs})
        for flags in variants.values():
            for f in precompile(cfgs, q, limits.arch, cache, extra_flags=flags):
                print("COMPILE FAILED", f[:300], flush=True)
    print(
        f"compiled {sum(len(c) for c in plans.values())} (shape, config) pairs x {len(variants)} variants "
        f"for {limits.arch}",
        flush=True,
    )
    bw = copy_bandwidth()
    stream = cuda.Stream()
    rows = []
    for (H, Q, P), cfgs in plans.items():
        for layout in args.layouts.split(","):
            sets = rotating_inputs(
                prefix_lens=[P], q_len=Q, H=H, l2_bytes=limits.l2_bytes, seed=H + Q + P, layout=layout
            )
            ref = reference(sets[0])[0]
            out = torch.empty(1, Q, H, 512, dtype=torch.bfloat16, device="cuda")
            floor = floor_bytes([P], q_len=Q, H=H) / bw * 1e6
            gflop = flops([P], q_len=Q, H=H) / 1e9
            for cfg in cfgs:
                for vname, flags in variants.items():
                    row = {
                        "H": H,
                        "Q": Q,
                        "prefix": P,
                        "config": str(cfg),
                        "variant": vname,
                        "layout": layout,
                        "floor_us": floor,
                        "gflop": gflop,
                    }
                    rows.append(row | time_one(cfg, H, Q, limits, cache, flags, sets, out, ref, stream))
                    us = rows[-1].get("us")
                    print(
                        f"H={H:3d} Q={Q:2d} P={P:6d} {layout[:4]} {vname:8s} "
                        + (
                            f"{us:8.1f} us  x{us / floor:5.2f} floor  {gflop / us * 1e3:5.0f} TF"
                            if us
                            else f"WRONG/FAILED {rows[-1].get('error', '')}"
                        )
                        + f"  {cfg}",
                        flush=True,
                    )
            sets = []
            torch.cuda.empty_cache()
    phases = []
    for spec in filter(None, args.phases.split(",")):
        phases += run_phases(limits, rows, tuple(int(x) for x in spec.split(":")), cache, stream)
    write(args.out, args.tag, limits, bw, rows, phases)


def time_one(cfg, H, Q, limits, cache, flags, sets, out, ref, stream) -> dict:
    """Gate one (config, flags) against the reference, then time it; the outcome as a row."""
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.reference import poisoned_run_error
    from verify_tuner.kernels.timing import time_graph

    try:
        va = VerifyAttention(cfg, H=H, q_len=Q, limits=limits, max_batch=1, cache_dir=cache, extra_flags=flags)
    except Exception as exc:  # noqa: BLE001 - a sweep records the failure and goes on
        return {"us": None, "error": str(exc)[:200]}
    info = {"regs": va.report.get("registers"), "spills": va.report.get("spill_stores"), "smem": va.smem}
    err = poisoned_run_error(lambda: va.run(sets[0], out, stream=stream), out, ref)
    if err > 1e-2:
        return info | {"us": None, "rel_err": err, "error": f"rel err {err:.3g}"}
    t = time_graph(lambda k: va.run(sets[k], out, stream=stream), len(sets), stream=stream)
    return info | {"rel_err": err, "us": t.median_us, "p10_us": t.p10_us, "p90_us": t.p90_us}


def run_phases(limits, rows, shape_key, cache, stream) -> list[dict]:
    """Time the fastest base config at `shape_key` whole, partial alone, and with one phase left
    out (outputs of those variants are wrong by design and not checked)."""
    import torch
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.timing import rotating_inputs, time_graph

    H, Q, P = shape_key
    ok = [
        r
        for r in rows
        if (r["H"], r["Q"], r["prefix"]) == shape_key
        and r.get("us")
        and r["variant"] == "base"
        and r["layout"] == "scattered"
    ]
    if not ok:
        return []
    cfg = parse_cfg(min(ok, key=lambda r: r["us"])["config"])
    sets = rotating_inputs(prefix_lens=[P], q_len=Q, H=H, l2_bytes=limits.l2_bytes, seed=1)
    out = torch.empty(1, Q, H, 512, dtype=torch.bfloat16, device="cuda")
    res = []
    for name, flags, full in PHASES:
        va = VerifyAttention(cfg, H=H, q_len=Q, limits=limits, max_batch=1, cache_dir=cache, extra_flags=flags)
        t = time_graph(
            lambda k, va=va, full=full: va.run(sets[k], out, stream=stream, reduce=full), len(sets), stream=stream
        )
        res.append({"H": H, "Q": Q, "prefix": P, "config": str(cfg), "variant": name, "us": t.median_us})
        print(f"phase H={H} Q={Q} P={P} {name:14s} {t.median_us:8.1f} us  {cfg}", flush=True)
    return res


def write(out: Path, tag: str, limits, bw: float, rows: list[dict], phases: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.date.today().isoformat()
    meta = {
        "device": limits.name,
        "arch": limits.arch,
        "date": stamp,
        "copy_bw_GBps": bw / 1e9,
        "rows": rows,
        "phases": phases,
    }
    (out / f"{tag}_{limits.arch}.json").write_text(json.dumps(meta, indent=1))
    lines = [
        f"# Kernel structure sweep — {limits.name} ({limits.arch}), {stamp}",
        "",
        (
            "Median µs per launch pair (partial + reduce) of CUDA-graph replays, inputs rotated past the L2; "
            f"floor = bytes moved once / {bw / 1e9:.0f} GB/s copy bandwidth. Every timed config passed the "
            "fp32-reference gate (rel. error ≤ 1e-2) first."
        ),
        "",
        "| H | Q | prefix | layout | variant | µs | × floor | TFLOP/s | regs | smem KB | config |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["H"], r["Q"], r["prefix"], r["layout"], r.get("us") or 1e9)):
        us = r.get("us")
        cells = (
            f"{us:.1f} | {us / r['floor_us']:.2f} | {r['gflop'] / us * 1e3:.0f}"
            if us
            else f"{r.get('error', 'failed')} | | "
        )
        smem = f"{r['smem'] / 1024:.0f}" if r.get("smem") else ""
        lines.append(
            f"| {r['H']} | {r['Q']} | {r['prefix']} | {r['layout']} | {r['variant']} | {cells} | "
            f"{r.get('regs', '')} | {smem} | {r['config']} |"
        )
    if phases:
        lines += [
            "",
            "Phase split (variants leave one phase out; their outputs are not checked):",
            "",
            "| H | Q | prefix | variant | µs | config |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {p['H']} | {p['Q']} | {p['prefix']} | {p['variant']} | {p['us']:.1f} | {p['config']} |" for p in phases
        ]
    (out / f"{tag}_{limits.arch}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
