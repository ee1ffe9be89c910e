"""bench/ncu_regions.py on a small kernel of the partial kernel's shape (no GPU, no nvcc), and once
on this tree's kernel where nvcc and nvdisasm are at hand.

The small kernel has the structure the regions are read from: the plan, prologue and epilogue
comments, a segment loop around a tile loop, QK, a barrier and the seesaw's two PV calls."""

from __future__ import annotations

import csv
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import ncu_regions
import sass_loops

needs_tools = pytest.mark.skipif(
    shutil.which("nvcc") is None or sass_loops.tools_dir() is None, reason="needs nvcc, cuobjdump and nvdisasm"
)

SOURCE = """\
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n)); }
__device__ void qk_tile(float* s) {
  s[0] = 1.f;
}
__device__ void pv_tile(float* acc) {
  acc[0] += 1.f;
}
extern "C" __global__ void kern(float* s, float* acc, int n) {
  const int tid = threadIdx.x;  // "{ a string with a brace"
  // ---- the plan: one segment
  __syncthreads();
  while (n > 0) {
    // ---- prologue
    s[tid] = 0.f;
    for (int t = 0; t < n; ++t) {
      qk_tile(s);
      bar_sync(1, 64);
      pv_tile(acc);
      pv_tile(acc + 1);
    }
    // ---- epilogue
    __syncthreads();
    acc[tid] *= 2.f;
    n -= 1;
  }
}
"""

# (SASS, inline chain innermost first, samples by reason, the region it belongs to)
PROGRAM = [
    ("S2R R0, SR_TID.X", (9,), {"wait": 1}, "entry/exit"),
    ("BAR.SYNC.DEFER_BLOCKING 0x0", (11,), {}, "plan"),
    ("IMAD R1, R0, 0x4, RZ", (11,), {"barrier": 3, "wait": 1}, "plan"),
    ("STS [R1], RZ", (14,), {"wait": 2}, "prologue"),
    ("HMMA.16816.F32.BF16 R4, R8, R12, RZ", (3, 16), {"wait": 7, "math": 1}, "loop QK"),
    ("BAR.SYNC.DEFER_BLOCKING R2, 0x40", (1, 17), {}, "loop barriers"),
    ("FADD R5, R5, 1", (6, 18), {"barrier": 4, "wait": 1}, "loop PV, other group's tile"),
    ("FADD R6, R6, 1", (6, 19), {"wait": 2}, "loop PV, own tile"),
    ("@P0 BRA 0x40", (15,), {"branch_resolving": 1}, "loop control/other"),
    ("BAR.SYNC.DEFER_BLOCKING 0x0", (22,), {"barrier": 1}, "epilogue"),
    ("FMUL R7, R7, 2", (23,), {"barrier": 2}, "epilogue"),
    ("EXIT", (26,), {}, "entry/exit"),
]
REASONS = ("barrier", "branch_resolving", "math", "wait")


def _listing(program=PROGRAM, shift=lambda line: line) -> str:
    """nvdisasm -gi's text for the program: a //## block per instruction, each frame inlined at the next."""
    out = ["//--------------------- .text.kern --------------------------", "kern:"]
    for k, (text, frames, _, _) in enumerate(program):
        lines = [shift(ln) for ln in frames]
        for inner, outer in zip(lines, [*lines[1:], None], strict=True):
            at = f' inlined at "/tmp/x/verify_attention.cu", line {outer}' if outer else ""
            out.append(f'\t//## File "/tmp/x/verify_attention.cu", line {inner}{at}')
        out.append(f"        /*{16 * k:04x}*/                   {text} ;")
    return "\n".join(out) + "\n"


def _write_csv(path: Path, program=PROGRAM) -> Path:
    """The program as ncu's source page writes it: "Kernel Name" first, then the header."""
    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
    head += [f"stall_{r}" for r in REASONS] + [f"stall_{r} (Not Issued)" for r in REASONS]
    with path.open("w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["Kernel Name", "kern"])
        w.writerow(head)
        for k, (text, _, stalls, _) in enumerate(program):
            row = [hex(0x7F0000 + 16 * k), "      " + text, sum(stalls.values()), 100 + k]
            w.writerow(row + [stalls.get(r, 0) for r in REASONS] + [0] * len(REASONS))
    return path


def _attribute(tmp_path, source=SOURCE, listing=None):
    kernel, rows = ncu_regions.read_profile(_write_csv(tmp_path / "p.csv"))
    src = ncu_regions.SourceMap(source, kernel)
    return ncu_regions.attribute(rows, ncu_regions.parse_listing(listing or _listing(), kernel), src)


def test_each_instruction_lands_in_its_region(tmp_path):
    recs = _attribute(tmp_path)
    assert [r.region for r in recs] == [p[3] for p in PROGRAM]


def test_barrier_samples_move_back_to_their_bar_sync(tmp_path):
    """ncu books a barrier's wait on an instruction after the BAR.SYNC; the other reasons stay."""
    recs = {r.offset // 16: r for r in _attribute(tmp_path)}
    assert (recs[1].stalls["barrier"], recs[2].stalls["barrier"], recs[2].stalls["wait"]) == (3, 0, 1)
    assert (recs[5].stalls["barrier"], recs[6].stalls["barrier"], recs[6].stalls["wait"]) == (4, 0, 1)
    assert (recs[9].stalls["barrier"], recs[10].stalls["barrier"]) == (3, 0)  # its own sample and the moved


def test_region_totals_add_up_to_the_samples(tmp_path):
    recs = _attribute(tmp_path)
    total = sum(sum(s.values()) for _, _, s, _ in PROGRAM)
    text = ncu_regions.markdown(recs, ncu_regions.SourceMap(SOURCE, "kern"), ["# test"])
    table = text.split("## Regions", 1)[1].split("## Stall reasons", 1)[0]
    rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| ")][1:]
    assert sum(float(r[2]) for r in rows if "total" not in r[0]) == total
    assert next(r for r in rows if "total" in r[0])[2].strip() == str(total)


def test_regions_follow_the_source_not_its_line_numbers(tmp_path):
    """Lines added above the kernel and inside the tile loop move every line after them."""
    lines = SOURCE.splitlines()
    moved = "\n".join(["// a new helper", "", *lines[:15], "      // a new comment in the loop", *lines[15:]]) + "\n"
    recs = _attribute(tmp_path, moved, _listing(shift=lambda ln: ln + 2 + (ln > 15)))
    assert [r.region for r in recs] == [p[3] for p in PROGRAM]


def test_a_kernel_without_its_region_comments_is_refused():
    with pytest.raises(ncu_regions.RegionError, match="prologue"):
        ncu_regions.SourceMap(SOURCE.replace("// ---- prologue", "// prologue"), "kern")


def _run(tmp_path, monkeypatch, listing: str) -> str:
    """The command on the test profile, with `listing` as the rebuilt cubin's nvdisasm -gi."""
    monkeypatch.setattr(ncu_regions, "rebuilt_listing", lambda **kw: (listing, "nvcc (test)"))
    source = tmp_path / "verify_attention.cu"
    source.write_text(SOURCE)
    out = tmp_path / "r.md"
    config = "NSPLIT=132 HT=8 TK=32 BLOCK=256 STAGES=3 QT=0 WR=2 WK=2 SF=1 PIPE=3"
    argv = [str(_write_csv(tmp_path / "p.csv")), "--config", config, "--q-len", "9", "--arch", "sm_90"]
    ncu_regions.main([*argv, "--source", str(source), "--device", "test GPU", "--out", str(out)])
    return out.read_text()


def test_the_command_writes_the_report(tmp_path, monkeypatch):
    text = _run(tmp_path, monkeypatch, _listing())
    assert "test GPU" in text and "## Top 25 source lines" in text and "## Barrier samples per barrier line" in text
    assert "| loop PV, own tile | 1 | 2 |" in text


@pytest.mark.parametrize(
    "program",
    [
        [*PROGRAM[:4], ("HMMA.16816.F32.F16 R4, R8, R12, RZ", (3, 16), {}, ""), *PROGRAM[5:]],  # another opcode
        PROGRAM[:-1],  # one instruction fewer
    ],
)
def test_a_rebuilt_sass_unlike_the_profiled_one_is_refused_in_one_line(tmp_path, monkeypatch, program):
    with pytest.raises(SystemExit) as refused:
        _run(tmp_path, monkeypatch, _listing(program))
    assert isinstance(refused.value.code, str) and "\n" not in refused.value.code
    assert "--source" in refused.value.code
    assert not (tmp_path / "r.md").exists()


@pytest.mark.parametrize(
    "spoil, says",
    [
        (lambda text: text.replace('"Instructions Executed"', '"Executed"'), "'Instructions Executed' column"),
        (lambda text: text.replace('"0x7f0010"', '"row two"'), "line 4"),
        (lambda text: text.replace('"0x7f0010",', ""), "line 4"),
    ],
    ids=["a missing column", "an address that is not hex", "a short row"],
)
def test_a_spoilt_profile_is_refused_in_one_line(tmp_path, monkeypatch, spoil, says):
    path = _write_csv(tmp_path / "p.csv")
    path.write_text(spoil(path.read_text()))
    with pytest.raises(ncu_regions.RegionError, match=says) as refused:
        ncu_regions.read_profile(path)
    assert "\n" not in str(refused.value)


def test_a_q_len_the_kernel_does_not_take_is_refused_before_building(tmp_path, monkeypatch):
    monkeypatch.setattr(ncu_regions, "rebuilt_listing", lambda **kw: pytest.fail("built"))
    argv = [
        str(_write_csv(tmp_path / "p.csv")),
        "--config",
        "NSPLIT=1 HT=8 TK=32 BLOCK=256 STAGES=3 QT=0 WR=2 WK=2 SF=1 PIPE=3",
    ]
    with pytest.raises(SystemExit, match="--q-len 0"):
        ncu_regions.main([*argv, "--q-len", "0", "--arch", "sm_90", "--out", str(tmp_path / "r.md")])


def test_the_command_has_help(capsys):
    with pytest.raises(SystemExit) as done:
        ncu_regions.main(["--help"])
    assert done.value.code == 0
    assert "--source" in capsys.readouterr().out


@needs_tools
def test_this_trees_kernel_has_every_region(tmp_path):
    """The H200's H=8 q=9 default built from this tree: each region the report names holds code,
    so an edit that drops a region comment or renames a loop function shows here."""
    config = sass_loops.DEFAULT
    listing, _ = ncu_regions.rebuilt_listing(
        source=ncu_regions.SOURCE, config=config, q_len=9, arch="sm_90", kv_dtype="bf16", flags=()
    )
    ins = ncu_regions.parse_listing(listing, "verify_attn_partial")
    rows = [ncu_regions.Row(0x7F0000 + i.offset, i.text, 1.0, 1.0, {"wait": 1.0}) for i in ins]
    src = ncu_regions.SourceMap(ncu_regions.SOURCE.read_text(), "verify_attn_partial")
    regions = {r.region for r in ncu_regions.attribute(rows, ins, src)}
    expected = {"entry/exit", "plan", "prologue", "epilogue", "loop QK", "loop softmax", "loop refill"}
    expected |= {"loop PV, own tile", "loop PV, other group's tile", "loop cp.async wait", "loop barriers"}
    assert expected <= regions, expected - regions
