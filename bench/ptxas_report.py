"""Registers, spills, shared memory and (where cuobjdump and nvdisasm are found: on PATH or the
dev extra's nvidia-cuda-cuobjdump and -nvdisasm wheels) the tile loop's instructions of the heuristic
defaults per mode, for sm_90 and sm_120,
from nvcc's ptxas report (no GPU needed), for each cache build: bf16, fp8_e4m3 and fp8_e4m3_qk,
each at the bf16 default's config, so the builds compare like for like. Writes a markdown table.

    python3 bench/ptxas_report.py --out OUT
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sass_loops import mma_loops, sass, tools_dir
from verify_tuner.heuristic import BANDWIDTH_ROWS, heuristic_config
from verify_tuner.kernels.build import compile_cubin, nvcc_version, ptxas_report
from verify_tuner.kernels.limits import known_device
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    args = ap.parse_args()
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
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ptxas_defaults.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
