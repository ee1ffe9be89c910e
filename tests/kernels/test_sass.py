"""The tile loop's SASS (no GPU: nvcc, and cuobjdump + nvdisasm from the nvidia-cuda-* wheels).

A per-warp predicate on an ldmatrix or mma that ptxas cannot prove warp-uniform makes it fence
each one with WARPSYNC, which also keeps every load right before its MMAs; removing the fences
from the seesaw's QK measured 2-7 % (bench/results/ab_kernel_flags_sm_90.md). These tests keep
them out of the defaults' tile loops.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.build import compile_cubin, ptxas_report
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import known_device

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import sass_loops

needs_tools = pytest.mark.skipif(
    shutil.which("nvcc") is None or sass_loops.tools_dir() is None, reason="needs nvcc, cuobjdump and nvdisasm"
)


def _default_build(tmp_path, device, H, q_len, kv_dtype, flags=()):
    """A device's default at (H, q_len, P=46000), built for its arch, and that config."""
    limits = known_device(device)
    cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=46000, kv_dtype=kv_dtype)
    return compile_cubin(cfg, q_len, limits.arch, tmp_path, tuple(flags), kv_dtype=kv_dtype), cfg


def _default_sass(tmp_path, device, H, q_len, kv_dtype, flags=()):
    """The partial kernel's SASS of a device's default at (H, q_len, P=46000), and that config."""
    built, cfg = _default_build(tmp_path, device, H, q_len, kv_dtype, flags)
    return sass_loops.sass(built.path), cfg


def _loop_fences(tmp_path, cfg, q_len, arch, kv_dtype, flags=()):
    """WARPSYNCs in the innermost loop holding MMAs of `cfg`'s partial kernel."""
    ins = sass_loops.sass(compile_cubin(cfg, q_len, arch, tmp_path, tuple(flags), kv_dtype=kv_dtype).path)
    loop = min(sass_loops.mma_loops(ins), key=lambda lp: lp["ins"])
    return sum("WARPSYNC" in text for addr, text in ins if loop["lo"] <= addr <= loop["hi"])


def _tile_loop_fences(tmp_path, device, H, q_len, kv_dtype, flags=()):
    """The same count for a device's default at (H, q_len, P=46000), and that config."""
    limits = known_device(device)
    cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=46000, kv_dtype=kv_dtype)
    return _loop_fences(tmp_path, cfg, q_len, limits.arch, kv_dtype, flags), cfg


@needs_tools
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
@pytest.mark.parametrize("H, q_len", [(8, 9), (64, 9), (8, 64)])
def test_the_seesaws_tile_loop_has_no_fenced_mmas(tmp_path, kv_dtype, H, q_len):
    """The H200's 64- and 72-row seesaw defaults: a handful of fences (barrier arrivals), not one per
    predicated load and MMA (57 before: the fifth of nine row tiles ran under a per-warp predicate)."""
    fences, cfg = _tile_loop_fences(tmp_path, "h200", H, q_len, kv_dtype)
    assert cfg.pipe == 3, cfg
    assert fences <= 4, (cfg, fences)


@needs_tools
def test_the_fence_count_sees_the_predicated_qk(tmp_path):
    """The count can fail: the predicated QK (VA_QK_UNIFORM=0) fences every load and MMA of the
    fifth row tile."""
    fences, cfg = _tile_loop_fences(tmp_path, "h200", 8, 9, "bf16", ("-DVA_QK_UNIFORM=0",))
    assert fences > 40, (cfg, fences)


@needs_tools
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e4m3_qk"])
def test_e4m3_row_groups_over_uneven_row_tiles_keep_no_fenced_mmas(tmp_path, kv_dtype):
    """Five row tiles over four row groups (the RTX PRO 6000's e4m3 default at H=8 q=9 until the
    balanced template, still in the tuner's space; running the missing tiles would add three to
    five) keep their predicates, made warp-uniform by a shuffle: 55 fences before on fp8_e4m3, 19
    on fp8_e4m3_qk. The default now gives every warp all five row tiles: no fenced load or MMA at all."""
    split = KernelConfig(nsplit=94, ht=4, tk=32, block=256, stages=2, wr=4, wk=2, sf=0, pipe=1)
    assert _loop_fences(tmp_path, split, 9, "sm_120", kv_dtype) <= 4
    assert _loop_fences(tmp_path, split, 9, "sm_120", kv_dtype, ("-DVA_QK_UNIFORM=0",)) > 15
    fences, report, cfg = _predicated_fences(tmp_path, "rtx-pro-6000", 8, 9, kv_dtype)
    assert (cfg.wr, fences) == (1, 0), (cfg, fences)
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (cfg, report)


def _predicated_fences(tmp_path, device, H, q_len, kv_dtype, flags=()):
    """WARPSYNCs under a per-warp predicate anywhere in the default's partial kernel (the shuffles'
    out-of-line fallbacks are unpredicated WARPSYNC.COLLECTIVE and not counted), its ptxas report
    and its config."""
    built, cfg = _default_build(tmp_path, device, H, q_len, kv_dtype, flags)
    fences = sum(bool(re.search(r"@!?P\d WARPSYNC", text)) for _, text in sass_loops.sass(built.path))
    return fences, ptxas_report(built.ptxas_log), cfg


@needs_tools
@pytest.mark.parametrize("device", ["rtx-pro-6000", "l40s"])
def test_the_small_folded_e4m3_seesaws_keep_no_fenced_mmas(tmp_path, device):
    """The 99-100 KB devices' e4m3 defaults at 17-24 rows (H=8 q=3) fold their scores (SF=1), which
    kept the fenced QK meant for the 72-row seesaw that the unfenced one spills on sm_80/89/90 (27
    fenced loads and MMAs); at 64 rows and fewer the unfenced one builds without spills."""
    fences, report, cfg = _predicated_fences(tmp_path, device, 8, 3, "fp8_e4m3")
    assert (cfg.sf, cfg.pipe) == (1, 3), cfg
    assert fences == 0, (cfg, fences)
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (cfg, report)
    fenced, _, _ = _predicated_fences(tmp_path, device, 8, 3, "fp8_e4m3", ("-DVA_QK_UNIFORM=0",))
    assert fenced > 15, (cfg, fenced)


@needs_tools
@pytest.mark.parametrize(
    "device, kv_dtype, stsm",
    [("h200", "bf16", True), ("rtx-pro-6000", "bf16", True), ("a100", "bf16", False), ("h200", "fp8_e4m3", False)],
)
def test_the_epilogue_stages_bf16_fragments_with_stmatrix_where_the_arch_has_it(tmp_path, device, kv_dtype, stsm):
    """The epilogue's 144 scalar stores a warp (each with its own address arithmetic) became 18
    transposing stmatrix on sm_90 and later; sm_80 has no stmatrix and e4m3's fragments hold their
    dims in another order, so both keep the stores."""
    ins, cfg = _default_sass(tmp_path, device, 8, 9, kv_dtype)
    stsm_count = sum("STSM" in text for _, text in ins)
    assert (stsm_count > 0) == stsm, (device, cfg, stsm_count)
    without, _ = _default_sass(tmp_path, device, 8, 9, kv_dtype, ("-DVA_EPI_STMATRIX=0",))
    assert not any("STSM" in text for _, text in without)


@needs_tools
@pytest.mark.parametrize(
    "device, kv_dtype, bulk",
    [("h200", "bf16", True), ("h200", "fp8_e4m3", True), ("rtx-pro-6000", "bf16", True), ("a100", "bf16", False)],
)
def test_the_bulk_epilogue_writes_rows_with_bulk_copies_where_the_arch_has_them(tmp_path, device, kv_dtype, bulk):
    """With VA_EPI_BULK=1 each output row leaves shared memory as one cp.async.bulk (UBLKCP) on
    sm_90 and later, its staging fenced for the copy engine first; sm_80 has neither and keeps the
    16-byte stores, as does the default build everywhere."""
    ins, cfg = _default_sass(tmp_path, device, 8, 9, kv_dtype, ("-DVA_EPI_BULK=1",))
    copies = sum("UBLKCP" in text for _, text in ins)
    fences = sum("FENCE.VIEW.ASYNC.S" in text for _, text in ins)
    assert (copies > 0, fences > 0) == (bulk, bulk), (device, cfg, copies, fences)
    default, _ = _default_sass(tmp_path, device, 8, 9, kv_dtype)
    assert not any("UBLKCP" in text for _, text in default)


def test_qk_load_use_counts_qk_mmas_from_their_latest_ldmatrix_only():
    """A QK mma (A from a plain ldmatrix) is counted at its distance from the nearest of its loaded
    operands; PV's (A from a transposed ldmatrix) and one whose A a later instruction overwrote
    are not; predicates and .reuse flags do not hide an operand."""
    ins = list(
        enumerate(
            [
                "LDSM.16.M88.4 R4, [R2]",
                "LDSM.16.M88.2 R8, [R2+0x10]",
                "IADD3 R1, R1, 0x1, RZ",
                "HMMA.16816.F32.BF16 R12, R4.reuse, R8, R12",  # A 3 after, B 2 after: 2
                "@P0 HMMA.16816.F32.BF16 R16, R4, R8.reuse, R16",  # 3
                "LDSM.16.MT88.4 R20, [R3]",
                "HMMA.16816.F32.BF16 R12, R20, R8, R12",  # PV: A transposed
                "MOV R5, RZ",
                "HMMA.16816.F32.BF16 R12, R4, R8, R12",  # A no longer the load's
            ]
        )
    )
    assert sass_loops.qk_load_use(ins) == [2, 3]


@needs_tools
def test_every_qk_mma_of_the_h200_bf16_default_is_found(tmp_path):
    """The H200's bf16 72-row default: every QK mma of the seesaw's tile is found (18 k-steps a
    warp x 5 row tiles x 2 token tiles), none issues right after its load."""
    built, _ = _default_build(tmp_path, "h200", 8, 9, "bf16")
    d = sass_loops.qk_load_use(sass_loops.sass(built.path))
    assert len(d) == 180 and min(d) >= 2


@needs_tools
@pytest.mark.parametrize("device", ["h200", "rtx-pro-6000", "a100"])
def test_ds_mla_runs_its_rope_on_bf16_mmas_and_scales_its_fragments(tmp_path, device):
    """fp8_ds_mla at a device's default (H=8 q=9): its rope k-steps are bf16 MMAs taking the place
    of as many f16 ones (the MMA count is fp8_e4m3's at the same config) and its block scales are
    HMUL2s on the fragments; an fp8_e4m3 build of that config has neither, and the loop has no
    more WARPSYNCs than fp8_e4m3's."""
    limits = known_device(device)
    cfg = heuristic_config(limits, H=8, q_len=9, prefix=46000, kv_dtype="fp8_ds_mla")

    def ops(kv_dtype):
        ins = sass_loops.sass(compile_cubin(cfg, 9, limits.arch, tmp_path, (), kv_dtype=kv_dtype).path)
        names = [t.split()[1] if t.startswith("@") else t.split()[0] for _, t in ins]
        return {k: sum(n.startswith(k) for n in names) for k in ("HMMA.16816.F32.BF16", "HMMA.16816.F32", "HMUL2")}

    ds, e4m3 = ops("fp8_ds_mla"), ops("fp8_e4m3")
    assert ds["HMMA.16816.F32.BF16"] > 0 and ds["HMUL2"] > 0, ds
    assert e4m3["HMMA.16816.F32.BF16"] == 0 and e4m3["HMUL2"] == 0, e4m3
    assert ds["HMMA.16816.F32"] == e4m3["HMMA.16816.F32"], (ds, e4m3)  # (the .BF16 ones count in both)
    assert _loop_fences(tmp_path, cfg, 9, limits.arch, "fp8_ds_mla") <= _loop_fences(
        tmp_path, cfg, 9, limits.arch, "fp8_e4m3"
    )
