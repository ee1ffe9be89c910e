"""Where the partial kernel's loops that hold mma instructions lie in its SASS, per compile-flag
variant (no GPU: nvcc, cuobjdump and nvdisasm, on PATH or from the dev extra's nvidia-cuda-* wheels). The H200
measured the same tile loop up to 1.3x slower when it lands further into the kernel's code
(bench/results/ab_kernel_flags_sm_90.md), so a change that moves code is checked here first.

    python bench/sass_loops.py --flags= --flags=-DVA_SPLIT_LIKELY [--config "NSPLIT=132 HT=8 ..."] [--q-len 9]
    python bench/sass_loops.py --source .v6/verify_attention.cu     # this tree's against another source

With --source, the same config is also built from another revision's .cu (this tree's #defines
over its text, as bench/kernel_v7.py builds v6), and the opcodes whose counts differ are listed.

One line per loop (a backward branch's target to the branch, innermost loops too): its byte
range, instructions, mma (HMMA) and local-memory (spill) instructions; then, for bf16 builds, how
many instructions separate each QK mma from its latest ldmatrix operand (min, p10, median): how
much of the loads' latency the schedule hides, which an operand-prefetch change should raise.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import compile_source, parse_config
from verify_tuner.kernels.build import compile_cubin, ptxas_report
from verify_tuner.kernels.config import KernelConfig

DEFAULT = KernelConfig(132, 8, 32, 256, stages=3, wr=2, wk=2, sf=1, pipe=3)  # the H200's H=8 q=9 default
_INS = re.compile(r"\s+/\*([0-9a-f]+)\*/\s+(.*?);")


def tools_dir() -> Path | None:
    """The folder holding cuobjdump and nvdisasm: PATH's, else the nvidia-cuda-* wheels' (the dev
    extra installs them into nvidia/cu*/bin, which is not on PATH)."""
    found = shutil.which("cuobjdump")
    if found and shutil.which("nvdisasm"):
        return Path(found).parent
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in sorted(Path(root).glob("cu*/bin")):
            if (sub / "cuobjdump").exists() and (sub / "nvdisasm").exists():
                return sub
    return None


def sass(cubin: Path, function: str = "verify_attn_partial") -> list[tuple[int, str]]:
    """(address, instruction) of one function of a cubin."""
    tools = tools_dir()
    if tools is None:
        raise FileNotFoundError("cuobjdump and nvdisasm: neither on PATH nor from the nvidia-cuda-* wheels")
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"}  # cuobjdump runs nvdisasm
    text = subprocess.run(
        [str(tools / "cuobjdump"), "-sass", str(cubin)], check=True, capture_output=True, text=True, env=env
    ).stdout
    out, cur = [], None
    for line in text.splitlines():
        if "Function : " in line:
            cur = line.split("Function : ", 1)[1].strip()
            continue
        m = _INS.match(line)
        if m and cur == function:
            out.append((int(m.group(1), 16), m.group(2)))
    return out


def mma_loops(ins: list[tuple[int, str]]) -> list[dict]:
    loops = []
    for addr, text in ins:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            lo = int(m.group(1), 16)
            body = [t for a, t in ins if lo <= a <= addr]
            mma = sum("HMMA" in t for t in body)
            if mma:
                spill = sum(("STL" in t or "LDL" in t) for t in body)
                loops.append({"lo": lo, "hi": addr, "ins": len(body), "hmma": mma, "spill": spill})
    return sorted(loops, key=lambda d: d["lo"])


def qk_load_use(ins: list[tuple[int, str]]) -> list[int]:
    """For each bf16 QK mma (an HMMA whose A fragment a non-transposed ldmatrix wrote; PV's V comes
    transposed, e4m3's K through conversions), how many instructions after its latest ldmatrix
    operand it issues in the listing: the room the schedule leaves that load's latency."""
    writer: dict[int, tuple[int, str]] = {}  # register -> (instruction index, opcode) of its last write
    out = []
    for i, (_, text) in enumerate(ins):
        words = re.sub(r"^@!?U?P[T0-9]+\s+", "", text).split(None, 1)
        op, operands = words[0], (words[1].split(", ") if len(words) > 1 else [])
        regs = [int(m.group(1)) if (m := re.fullmatch(r"R(\d+)(?:\.reuse)?", o.strip())) else None for o in operands]
        if op.startswith("HMMA") and len(regs) >= 3 and regs[1] is not None and regs[2] is not None:
            a, b = regs[1], regs[2]
            if all(writer.get(r, (0, ""))[1].startswith("LDSM.16.M88") for r in range(a, a + 4)):
                fed = [
                    i - writer[r][0]
                    for r in [*range(a, a + 4), b, b + 1]
                    if writer.get(r, (0, ""))[1].startswith("LDSM")
                ]
                out.append(min(fed))
        if regs and regs[0] is not None:
            width = 4 if op.startswith("HMMA") or op.endswith(".4") else 2 if op.endswith(".2") else 1
            for r in range(regs[0], regs[0] + width):
                writer[r] = (i, op)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flags", action="append", default=None, help="one variant's nvcc flags (repeatable)")
    ap.add_argument("--config", type=parse_config, default=DEFAULT)
    ap.add_argument("--q-len", type=int, default=9)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--source", type=Path, help="another revision's verify_attention.cu to build and compare")
    ap.add_argument("--kv-dtype", default="bf16", help="the cache format the builds read (kernels/formats.py)")
    args = ap.parse_args()
    if tools_dir() is None:
        raise SystemExit(
            "cuobjdump and nvdisasm: put them on PATH or install the nvidia-cuda-cuobjdump and "
            "nvidia-cuda-nvdisasm wheels (the dev extra has them)"
        )
    with tempfile.TemporaryDirectory() as cache:
        for flags in args.flags or [""]:
            built = compile_cubin(
                args.config, args.q_len, args.arch, Path(cache), tuple(flags.split()), kv_dtype=args.kv_dtype
            )
            ins = sass(built.path)
            rep = ptxas_report(built.ptxas_log)
            print(
                f"{flags or '(default)'}: {len(ins)} instructions, {rep['registers']} registers, spills {rep['spill_stores']}/{rep['spill_loads']} B"
            )
            _print_loops(ins)
            _print_load_use(ins)
        if args.source:
            other = compile_source(args.source, args.config, args.q_len, args.arch, Path(cache), args.kv_dtype)
            theirs = sass(other)
            print(f"{args.source}: {len(theirs)} instructions")
            _print_loops(theirs)
            mine, them = _opcodes(ins), _opcodes(theirs)
            diff = {op: (them.get(op, 0), mine.get(op, 0)) for op in sorted(set(mine) | set(them))}
            print("opcodes whose counts differ (that source -> this tree):")
            for op, (a, b) in diff.items():
                if a != b:
                    print(f"  {op:16s} {a:5d} -> {b:5d}")


def _print_loops(ins: list[tuple[int, str]]) -> None:
    for lp in mma_loops(ins):
        print(f"  {lp['lo']:#07x}-{lp['hi']:#07x}  {lp['ins']:5d} ins  {lp['hmma']:3d} HMMA  {lp['spill']} spill")


def _print_load_use(ins: list[tuple[int, str]]) -> None:
    d = sorted(qk_load_use(ins))
    if d:
        print(
            f"  QK mma after its ldmatrix: {len(d)} mma, min {d[0]}, p10 {d[len(d) // 10]}, median {d[len(d) // 2]} instructions"
        )


def _opcodes(ins: list[tuple[int, str]]) -> dict[str, int]:
    """Instruction count per opcode (predicates dropped, modifiers kept)."""
    counts: dict[str, int] = {}
    for _, text in ins:
        words = text.split()
        op = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "")
        counts[op] = counts.get(op, 0) + 1
    return counts


if __name__ == "__main__":
    main()
