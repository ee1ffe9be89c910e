"""Registers, spills, shared memory and (where cuobjdump and nvdisasm are found: on PATH or the
dev extra's nvidia-cuda-cuobjdump and -nvdisasm wheels) the tile loop's instructions of the heuristic
defaults per mode, for sm_90 and sm_120,
from nvcc's ptxas report (no GPU needed), for each cache build: bf16, fp8_e4m3 and fp8_e4m3_qk,
each at the bf16 default's config, so the builds compare like for like. Writes a markdown table.

    python3 bench/ptxas_report.py --out OUT [--every-default]

--every-default adds an audit of every known device's own default for each format its arch
reads (the format's own heuristic), at every power-of-two H up to 128 and every q_len 1..64,
one build per distinct structure and q_len (~1 300 builds, ~20 minutes on two cores): the
builds that spill and those whose SASS holds a WARPSYNC under a per-warp predicate (a fenced
load or MMA; the shuffles' out-of-line fallbacks are not predicated).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sass_loops import mma_loops, sass, tools_dir
from verify_tuner.heuristic import BANDWIDTH_ROWS, heuristic_config
from verify_tuner.kernels.build import compile_cubin, nvcc_version, ptxas_report
from verify_tuner.kernels.formats import KV_DTYPES, kv_format
from verify_tuner.kernels.limits import KNOWN_DEVICES, known_device
from verify_tuner.kernels.validate import smem_bytes

SHAPES = [(8, 9, 46000), (64, 9, 46000), (8, 9, 4096), (8, 1, 131072), (8, 64, 46000), (1, 33, 5000)]
DEVICES = ["h200", "rtx-pro-6000"]
#: (column, kv_dtype, nvcc flags): the builds each default is compiled as
BUILDS = [
    ("bf16", "bf16", ()),
    ("e4m3", "fp8_e4m3", ()),
    ("e4m3_qk", "fp8_e4m3_qk", ()),
]


def mode(cfg, q_len: int) -> str:
    rows = cfg.ht * cfg.row_tile(q_len)
    kind = "bandwidth" if rows <= BANDWIDTH_ROWS else f"compute PIPE={cfg.pipe}"
    return kind + (f", row tiles of {cfg.qt}" if cfg.qt else "")


def tile_loop(cubin: Path) -> str:
    """Instructions of the innermost loop of the partial kernel that holds HMMAs, or — without the tools."""
    if tools_dir() is None:
        return "—"
    loops = mma_loops(sass(cubin))
    return str(min(lp["ins"] for lp in loops)) if loops else "—"


def every_default() -> dict[tuple, list[tuple[str, int, int]]]:
    """Each distinct build among the known devices' own defaults: (arch, KernelConfig, q_len,
    kv_dtype) -> the (device, H, q_len) it serves (NSPLIT, a constant of the grid's size, aside)."""
    builds: dict[tuple, list[tuple[str, int, int]]] = {}
    seen: dict[tuple, tuple] = {}
    for limits in KNOWN_DEVICES.values():
        for kv in KV_DTYPES:
            if kv_format(kv).unsupported_reason(10 * limits.cc_major + limits.cc_minor):
                continue
            for H in (1, 2, 4, 8, 16, 32, 64, 128):
                for q in range(1, 65):
                    cfg = heuristic_config(limits, H=H, q_len=q, prefix=46000, kv_dtype=kv)
                    structure = " ".join(p for p in str(cfg).split() if not p.startswith("NSPLIT="))
                    sig = (limits.arch, structure, q, kv)
                    key = seen.setdefault(sig, (limits.arch, cfg, q, kv))
                    builds.setdefault(key, []).append((limits.name, H, q))
    return builds


def audit(folder: Path, key: tuple) -> tuple[dict[str, int], int]:
    """A build's ptxas report and its count of per-warp-predicated WARPSYNCs."""
    arch, cfg, q, kv = key
    built = compile_cubin(cfg, q, arch, folder, (), kv_dtype=kv)
    fences = sum(bool(re.search(r"@!?P\d WARPSYNC", text)) for _, text in sass(built.path))
    return ptxas_report(built.ptxas_log), fences


def audit_lines(folder: Path) -> list[str]:
    builds = every_default()
    with ThreadPoolExecutor(2) as ex:  # nvcc is single-threaded
        results = dict(zip(builds, ex.map(lambda k: audit(folder, k), builds), strict=True))
    lines = [
        "",
        f"## Every default ({len(builds)} distinct builds)",
        "",
        "Every known device's own default for each format its arch reads, at H = 1, 2, 4, ..., 128 and",
        "q_len 1..64 (one build per structure and q_len): builds, the most registers, and the builds",
        "that spill or fence a load or MMA under a per-warp predicate.",
        "",
        "| arch | kv_dtype | builds | max regs | spilling | fenced |",
        "|---|---|---|---|---|---|",
    ]
    bad = []
    for arch, kv in sorted({(k[0], k[3]) for k in builds}):
        keys = [k for k in builds if (k[0], k[3]) == (arch, kv)]
        spill = [k for k in keys if results[k][0]["spill_stores"] or results[k][0]["spill_loads"]]
        fenced = [k for k in keys if results[k][1]]
        regs = max(results[k][0]["registers"] for k in keys)
        lines.append(f"| {arch} | {kv} | {len(keys)} | {regs} | {len(spill)} | {len(fenced)} |")
        bad += sorted(set(spill) | set(fenced))
    if bad:
        lines += ["", "| arch | kv_dtype | config | q_len | spills (bytes) | fences | serves (device, H, q_len) |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for k in bad:
            r, f = results[k]
            serves = ", ".join(f"{d.removeprefix('NVIDIA ')} {h} {q}" for d, h, q in builds[k][:3])
            more = f" +{len(builds[k]) - 3}" if len(builds[k]) > 3 else ""
            lines.append(
                f"| {k[0]} | {k[3]} | {k[1]} | {k[2]} | {r['spill_stores']}/{r['spill_loads']} | {f} | {serves}{more} |"
            )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument(
        "--every-default", action="store_true", help="add the audit of every default (~20 min on two cores)"
    )
    args = ap.parse_args()
    if args.every_default and tools_dir() is None:
        ap.error("--every-default reads SASS: it needs cuobjdump and nvdisasm (PATH or the dev extra's wheels)")
    lines = [
        f"# ptxas report of the heuristic defaults — {dt.date.today().isoformat()}, {nvcc_version()}",
        "",
        "Per build: registers a thread, spill stores/loads (bytes), the block's shared memory (KB) and the",
        "instructions of the innermost loop holding HMMAs (the tile loop; `—` without cuobjdump).",
        "",
        "| device | arch | H | q_len | prefix | mode | rows | "
        + " | ".join(f"{label} regs (spills), KB, loop" for label, _, _ in BUILDS)
        + " | smem limit KB | config |",
        "|" + "---|" * (9 + len(BUILDS)),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name in DEVICES:
            limits = known_device(name)
            for H, q, P in SHAPES:
                cfg = heuristic_config(limits, H=H, q_len=q, prefix=P)
                cells = []
                for _, kv, flags in BUILDS:
                    built = compile_cubin(cfg, q, limits.arch, Path(tmp), flags, kv_dtype=kv)
                    r = ptxas_report(built.ptxas_log)
                    kb = smem_bytes(cfg, q, kv) / 1024
                    cells.append(
                        f"{r['registers']} ({r['spill_stores']}/{r['spill_loads']}), {kb:.1f}, {tile_loop(built.path)}"
                    )
                lines.append(
                    f"| {name} | {limits.arch} | {H} | {q} | {P} | {mode(cfg, q)} | "
                    f"{cfg.ht * cfg.row_tile(q)} | {' | '.join(cells)} | "
                    f"{limits.max_smem_optin // 1024} | {cfg} |"
                )
                print(lines[-1], flush=True)
        if args.every_default:
            lines += audit_lines(Path(tmp))
            print("\n".join(lines[-12:]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ptxas_defaults.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
