"""Nsight Compute's warp stall samples of the partial kernel, summed by region of its source.

bench/run_ncu.sh's NAME_sass.csv holds stall samples and executed instructions per SASS
instruction, but nothing there says which part of the kernel an instruction belongs to, and the
source page (NAME_cuda.csv) books an inlined helper's samples on the helper's line, not on the
call that matters (the same mma16816 line serves QK and both PVs). So this rebuilds the profiled
cubin here (no GPU: nvcc and nvdisasm), refuses unless its SASS is the profiled one opcode by
opcode at every offset, and reads each instruction's inline chain from `nvdisasm -gi`.

    python3 bench/ncu_regions.py OUT/h8_loop_sass.csv --config "NSPLIT=132 HT=8 ..." --q-len 9 \
        --arch sm_90 [--kv-dtype bf16] [--flags=-DVA_X=1] [--source OLD/verify_attention.cu] \
        [--device "NVIDIA H200"] [--date 2026-12-05] [--label TEXT] --out FILE.md

--source is the .cu the profile was built from when it is not this tree's (this tree's #defines
are rendered over its text, as bench/sass_loops.py does).

Regions come from the source's structure, so they survive edits that move lines: the tile loop is
the innermost for/while around pv_tile's call sites; inside it an instruction belongs to the
outermost function of its chain that LOOP_FUNCS names (a barrier inside qk_tile is QK's). Two
pv_tile calls in one loop are the seesaw's: the first applies the other group's P(t-1), the second
the group's own P(t) (PIPE 3 in verify_attention.cu). Outside the loop, the kernel line an
instruction came from is placed against the kernel's `// ---- the plan`, `// ---- prologue` and
`// ---- epilogue` comments; the epilogue ends with the loop around the tile loop (the segments).

A warp waiting at a BAR.SYNC.DEFER_BLOCKING is sampled on an instruction after it, so
stall_barrier samples are moved to the nearest BAR.SYNC before them.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import hashlib
import re
import shlex
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import compile_source, parse_config
from kernel_source import RegionError, SourceMap
from sass_loops import tools_dir
from verify_tuner.kernels.build import SOURCE, nvcc_version
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import TunerError
from verify_tuner.kernels.validate import MAX_Q_LEN

#: Functions whose calls inside the tile loop make a region (pv_tile's are split by call site).
LOOP_FUNCS = {
    "qk_tile": "loop QK",
    "softmax_tile": "loop softmax",
    "softmax_row": "loop softmax",
    "refill": "loop refill",
    "load_kv_tile": "loop refill",
    "fetch_indices": "loop refill",
    "cp_async_commit": "loop refill",
    "cp_async_wait": "loop cp.async wait",
    "bar_sync": "loop barriers",
    "bar_arrive": "loop barriers",
}
LOOP_OTHER = "loop control/other"
LEGEND = (
    "The tile loop is the innermost loop around pv_tile's calls; in it an instruction goes by the outermost "
    "function of its inline chain (a barrier inside qk_tile is QK's), else by its loop statement. Outside it, "
    "by the kernel line against the `// ---- the plan`, `// ---- prologue` and `// ---- epilogue` comments "
    "(entry/exit: before the plan and after the segments' loop). stall_barrier samples are moved to the "
    "BAR.SYNC before them: ncu books a barrier's wait on an instruction after it. Details: bench/ncu_regions.py."
)
_FRAME = re.compile(r'\s*//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')
_INS = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


@dataclass(frozen=True)
class Row:
    """One profiled SASS instruction: its samples by stall reason and warp-level executions."""

    address: int
    text: str
    samples: float
    executed: float
    stalls: dict[str, float]


@dataclass(frozen=True)
class Ins:
    """One rebuilt instruction and its source lines in the kernel's .cu, innermost first."""

    offset: int
    text: str
    frames: tuple[int, ...]


@dataclass
class Rec:
    """One instruction attributed: its leaf and kernel line, and its samples after the barrier move."""

    offset: int
    text: str
    region: str
    leaf: int | None
    site: int | None
    executed: float
    stalls: Counter = field(default_factory=Counter)


def read_profile(path: Path) -> tuple[str, list[Row]]:
    """The kernel's name and rows of an `ncu --page source --print-source sass --csv` file."""
    rows = list(csv.reader(path.read_text().splitlines()))
    kernel = next((r[1] for r in rows if len(r) > 1 and r[0] == "Kernel Name"), "verify_attn_partial")
    at = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if at is None:
        raise RegionError(f"{path}: no Address/Source header (not a SASS source-page CSV)")
    head = rows[at]
    missing = [n for n in ("Warp Stall Sampling (All Samples)", "Instructions Executed") if n not in head]
    if missing:
        raise RegionError(f"{path}: no {missing[0]!r} column (profile with bench/run_ncu.sh's metrics)")
    col = {name: head.index(name) for name in head}
    reasons = [h for h in head if h.startswith("stall_") and "(Not Issued)" not in h]

    def num(r: list[str], name: str) -> float:
        text = r[col[name]].replace(",", "").strip()
        return float(text) if text not in ("", "-") else 0.0

    out = []
    for n, r in enumerate(rows[at + 1 :], start=at + 2):
        if not any(r):
            continue
        try:
            if len(r) != len(head):
                raise ValueError(f"{len(r)} fields, the header {len(head)}")
            out.append(Row(int(r[col["Address"]], 16), " ".join(r[col["Source"]].split()),
                           num(r, "Warp Stall Sampling (All Samples)"), num(r, "Instructions Executed"),
                           {h.removeprefix("stall_"): num(r, h) for h in reasons}))  # fmt: skip
        except ValueError as exc:
            raise RegionError(f"{path}, line {n}: {exc}") from None
    return kernel, out


def parse_listing(text: str, function: str, file_name: str = SOURCE.name) -> list[Ins]:
    """`nvdisasm -gi`'s instructions of `function`; a `//##` block (innermost frame first, each
    line inlined at the next) holds for the instructions after it until the next block."""
    out: list[Ins] = []
    frames: list[int] = []
    inside = in_block = False
    for line in text.splitlines():
        if line.startswith("//---"):
            if inside:
                break
            inside = f".text.{function} " in line + " "
            continue
        m = _FRAME.match(line)
        if inside and m:
            frames = frames if in_block else []
            in_block = True
            frames += [int(m[2])] if Path(m[1]).name == file_name else []
            continue
        m = _INS.match(line)
        if inside and m:
            in_block = False
            out.append(Ins(int(m[1], 16), " ".join(m[2].split()), tuple(dict.fromkeys(frames))))
    return out


def check_match(rows: list[Row], ins: list[Ins]) -> None:
    """Raise unless the rebuilt SASS is the profiled one: same count, offsets and opcodes."""
    if len(rows) != len(ins):
        raise RegionError(
            f"the rebuilt SASS has {len(ins)} instructions, the profile {len(rows)}: "
            "pass the profiled tree's .cu as --source and its config, --q-len, --kv-dtype and --flags"
        )
    base = rows[0].address if rows else 0
    for r, i in zip(rows, ins, strict=True):
        if r.address - base != i.offset or _opcode(r.text) != _opcode(i.text):
            raise RegionError(
                f"the rebuilt SASS differs from the profile at {i.offset:#x} ({' '.join(_opcode(r.text))} "
                f"profiled, {' '.join(_opcode(i.text))} rebuilt): pass the profiled tree's .cu as --source "
                "and its config, --q-len, --kv-dtype and --flags"
            )


def _opcode(text: str) -> tuple[str, ...]:
    words = text.rstrip(" ;").split()
    return tuple(words[:2]) if words and words[0].startswith("@") else tuple(words[:1])


@dataclass(frozen=True)
class TileLoops:
    """The tile loop(s) (first, last line) and the region of each pv_tile call statement in them."""

    loops: tuple[tuple[int, int], ...]
    pv: dict[int, str]

    def holds(self, frames: tuple[int, ...]) -> bool:
        return any(lo <= ln <= hi for ln in frames for lo, hi in self.loops)


def attribute(rows: list[Row], ins: list[Ins], src: SourceMap) -> list[Rec]:
    """Each instruction's region, leaf line and kernel line, its barrier samples moved to the
    BAR.SYNC before it."""
    check_match(rows, ins)
    tile = tile_loops(ins, src)
    sites = [next((ln for ln in i.frames if src.structural(ln)), None) for i in ins]
    regions = [_region(i, site, src, tile) for i, site in zip(ins, sites, strict=True)]
    # a loop statement's code outside the function it calls (arguments, its branch) is the call's
    learned: dict[int, Counter] = defaultdict(Counter)
    for site, region in zip(sites, regions, strict=True):
        if site is not None and region.startswith("loop ") and region != LOOP_OTHER:
            learned[src.statement(site)][region] += 1
    recs = []
    for r, i, site, region in zip(rows, ins, sites, regions, strict=True):
        if region == LOOP_OTHER and site is not None and learned[src.statement(site)]:
            region = learned[src.statement(site)].most_common(1)[0][0]
        leaf = next((ln for ln in i.frames if not getattr(src.func(ln), "wrapper", True)), None)
        leaf = leaf or (i.frames[0] if i.frames else None)
        recs.append(Rec(i.offset, i.text, region, leaf, site, r.executed, Counter(r.stalls)))
    _move_barrier_samples(recs)
    return recs


def tile_loops(ins: list[Ins], src: SourceMap) -> TileLoops:
    """The innermost loops of the kernel around pv_tile's call statements (found from the
    chains, so a PIPE branch compiled out has none); one call is "loop PV", two the seesaw's."""
    calls: set[int] = set()
    for i in ins:
        names = [getattr(src.func(ln), "name", None) for ln in i.frames]
        if "pv_tile" in names:
            outer = len(names) - 1 - names[::-1].index("pv_tile")
            if outer + 1 < len(i.frames):
                calls.add(src.statement(i.frames[outer + 1]))
    by_loop: dict[tuple[int, int], list[int]] = defaultdict(list)
    for call in sorted(calls):
        loop = src.loop(call)
        if loop is not None and src.in_kernel(call):
            by_loop[loop].append(call)
    pv = {}
    for sites in by_loop.values():
        names = ["loop PV"] if len(sites) == 1 else ["loop PV, other group's tile", "loop PV, own tile"]
        pv.update({call: names[min(k, len(names) - 1)] for k, call in enumerate(sites)})
    return TileLoops(tuple(sorted(by_loop)), pv)


def _region(i: Ins, site: int | None, src: SourceMap, tile: TileLoops) -> str:
    if tile.holds(i.frames):
        for k in range(len(i.frames) - 1, -1, -1):  # outermost first
            name = getattr(src.func(i.frames[k]), "name", None)
            if name == "pv_tile" and k + 1 < len(i.frames):
                return tile.pv.get(src.statement(i.frames[k + 1]), "loop PV")
            if name in LOOP_FUNCS:
                return LOOP_FUNCS[name]
        return "loop barriers" if _is_bar_sync(i.text) else LOOP_OTHER  # __syncthreads()
    if site is None:
        return "other (no line of the kernel)"
    first = min((lo for lo, _ in tile.loops), default=src.markers["epilogue"])
    last = max((hi for _, hi in tile.loops), default=src.markers["epilogue"])
    outer = src.enclosing_loop(first, last) if tile.loops else None  # the segments' loop
    if site < src.markers["plan"]:
        return "entry/exit"
    if site < src.markers["prologue"]:
        return "plan"
    if site < first:
        return "prologue"
    return "epilogue" if site <= (outer[1] if outer else src.kernel.hi) else "entry/exit"


def _move_barrier_samples(recs: list[Rec]) -> None:
    bar = None
    for rec in recs:
        if _is_bar_sync(rec.text):
            bar = rec
        moved = rec.stalls["barrier"]
        if moved and bar is not None and bar is not rec:
            rec.stalls["barrier"] = 0
            bar.stalls["barrier"] += moved


def _is_bar_sync(text: str) -> bool:
    return _opcode(text)[-1].startswith(("BAR.SYNC", "BAR.RED"))


def _table(head: list[str], rows: list[list[object]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(str(c) for c in r) + " |" for r in rows
    ]


def _top(stalls: Counter, n: int = 2) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in stalls.most_common(n) if v > 0)


def _group(recs: list[Rec], key) -> dict[object, dict]:
    out: dict[object, dict] = {}
    for rec in recs:
        g = out.setdefault(key(rec), {"n": 0, "executed": 0.0, "stalls": Counter(), "recs": []})
        g["n"] += 1
        g["executed"] += rec.executed
        g["stalls"].update(rec.stalls)
        g["recs"].append(rec)
    for g in out.values():
        g["samples"] = sum(g["stalls"].values())
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["samples"]))


def markdown(recs: list[Rec], src: SourceMap, header: list[str], top: int = 25) -> str:
    """The report: regions, stall reasons per region, the top source lines, barrier lines."""
    total = sum(sum(r.stalls.values()) for r in recs) or 1.0
    executed = sum(r.executed for r in recs) or 1.0
    regions = _group(recs, lambda r: r.region)
    out = [*header, f"- {total:.0f} samples, {executed:.0f} executed warp instructions", "", "## Regions", ""]
    out += [LEGEND, ""]
    rows = [[k, g["n"], f"{g['samples']:.0f}", f"{g['samples'] / total:.1%}", f"{g['executed']:.0f}",
             f"{g['executed'] / executed:.1%}"] for k, g in regions.items()]  # fmt: skip
    rows.append(["**total**", len(recs), f"{total:.0f}", "100%", f"{executed:.0f}", "100%"])
    out += _table(["region", "SASS ins", "samples", "share", "executed ins", "share"], rows)
    everywhere = Counter()
    for g in regions.values():
        everywhere.update(g["stalls"])
    reasons = [k for k, v in everywhere.most_common() if v > 0]
    out += ["", "## Stall reasons per region (samples)", ""]
    rows = [[k] + [f"{g['stalls'][x]:.0f}" for x in reasons] for k, g in regions.items()]
    rows.append(["**all**"] + [f"{everywhere[x]:.0f} ({everywhere[x] / total:.1%})" for x in reasons])
    out += _table(["region", *reasons], rows)
    out += ["", f"## Top {top} source lines", "",
            ("line: the innermost line outside PTX wrappers and one-line helpers; kernel line: the kernel's "
            "(or its lambda's) line it was inlined at."), ""]  # fmt: skip
    lines = list(_group(recs, lambda r: (r.leaf, r.site)).items())[:top]
    rows = [[leaf, site, src.snippet(leaf), g["recs"][0].region, f"{g['samples']:.0f}",
             f"{g['samples'] / total:.1%}", f"{g['executed']:.0f}", _top(g["stalls"])]
            for (leaf, site), g in lines]  # fmt: skip
    out += _table(["line", "kernel line", "source", "region", "samples", "share", "executed", "top reasons"], rows)
    out += ["", "## Barrier samples per barrier line", ""]
    bars = [r for r in recs if r.stalls["barrier"] > 0 and _is_bar_sync(r.text)]
    by_line = _group(bars, lambda r: (r.leaf, r.site))
    rows = [[leaf, site, src.snippet(leaf), g["recs"][0].region, ", ".join(f"{r.offset:#x}" for r in g["recs"]),
             f"{g['stalls']['barrier']:.0f}", f"{g['stalls']['barrier'] / total:.1%}"]
            for (leaf, site), g in sorted(by_line.items(), key=lambda kv: -kv[1]["stalls"]["barrier"])]  # fmt: skip
    out += _table(["line", "kernel line", "source", "region", "BAR.SYNC at", "barrier samples", "of all"], rows)
    return "\n".join(out) + "\n"


def rebuilt_listing(
    *, source: Path, config: KernelConfig, q_len: int, arch: str, kv_dtype: str, flags: tuple[str, ...]
) -> tuple[str, str]:
    """`nvdisasm -gi` of the cubin the tuner builds for these settings, from `source`'s text with
    this tree's #defines (the build's nvcc flags, -lineinfo included), and nvcc's version."""
    tools = tools_dir()
    if tools is None:
        raise RegionError("nvdisasm: neither on PATH nor from the nvidia-cuda-* wheels (the dev extra has them)")
    with tempfile.TemporaryDirectory(prefix="ncu-regions-") as tmp:
        cubin = compile_source(source, config, q_len, arch, Path(tmp), kv_dtype, flags)
        dis = subprocess.run([str(tools / "nvdisasm"), "-gi", str(cubin)], check=False, capture_output=True, text=True)
        if dis.returncode != 0:
            raise RegionError(f"nvdisasm failed: {(dis.stderr.strip().splitlines() or ['?'])[-1]}")
        return dis.stdout, nvcc_version()


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", type=Path, help="ncu --page source --print-source sass --csv of the partial kernel")
    ap.add_argument("--config", required=True, help='the profiled config, "NSPLIT=132 HT=8 ..."')
    ap.add_argument("--q-len", type=int, required=True, help="the profiled q_len")
    ap.add_argument("--arch", required=True, help="the profiled device's arch, e.g. sm_90")
    ap.add_argument("--kv-dtype", default="bf16", help="the profiled cache format (kernels/formats.py)")
    ap.add_argument("--flags", default="", help="the profile's extra nvcc flags, as one string (--flags=...)")
    ap.add_argument("--source", type=Path, default=SOURCE, help="the profiled tree's .cu (default: this tree's)")
    ap.add_argument("--device", default="device not given", help="the profiled device, for the header")
    ap.add_argument("--date", help="the profile's date, for the header (default: the CSV's modification date)")
    ap.add_argument("--label", default="", help="what was profiled (shape, plan line), for the header")
    ap.add_argument("--out", type=Path, required=True, help="the markdown file to write")
    return ap


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    try:
        text = report(args, command=f"python3 bench/ncu_regions.py {shlex.join(argv)}")
        args.out.write_text(text)
    except (TunerError, OSError) as exc:
        raise SystemExit(f"ncu_regions: {exc}") from None
    print(f"wrote {args.out}")


def report(args: argparse.Namespace, command: str) -> str:
    """The markdown report of the parsed command line `args`."""
    config = parse_config(args.config)
    if not 1 <= args.q_len <= MAX_Q_LEN:
        raise RegionError(f"--q-len {args.q_len}: the kernel takes 1..{MAX_Q_LEN}")
    kernel, rows = read_profile(args.csv)
    flags = tuple(args.flags.split())
    listing, compiler = rebuilt_listing(
        source=args.source, config=config, q_len=args.q_len, arch=args.arch, kv_dtype=args.kv_dtype, flags=flags
    )
    text = args.source.read_text()
    src = SourceMap(text, kernel)
    recs = attribute(rows, parse_listing(listing, kernel), src)
    date = args.date or datetime.date.fromtimestamp(args.csv.stat().st_mtime).isoformat()
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    label = f"{args.label}; " if args.label else ""
    extra = f"`{args.flags}`" if args.flags else "none"
    header = [
        f"# {kernel}: stall samples by kernel region, {args.device} ({date})",
        "",
        f"- {label}config `{args.config}`, q_len {args.q_len}, {args.kv_dtype}, {args.arch}, extra flags {extra}",
        f"- source `{args.source}` (sha256 {digest}…), rebuilt with nvcc ({compiler}): the profile's opcode at each of its {len(recs)} offsets",
        f"- command: `{command}`",
    ]
    return markdown(recs, src, header)


if __name__ == "__main__":
    main()
