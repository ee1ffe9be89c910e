"""Compile-only checks (no GPU): the source builds for sm_80, sm_90 and sm_120."""

from __future__ import annotations

import shutil

import pytest
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.build import compile_cubin, ptxas_report, render
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import CompileError
from verify_tuner.kernels.limits import known_device
from verify_tuner.kernels.validate import check, smem_bytes

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def test_render_defines_sorted_constants_and_points_errors_at_the_cu():
    src = render(KernelConfig(nsplit=8, ht=2, tk=32, block=256, stages=3), q_len=9)
    head = src.splitlines()[:13]
    assert head[:12] == [
        "#define BLOCK 256",
        "#define HT 2",
        "#define KV_FMT 0",  # the cache's format (kernels/formats.py): bf16
        "#define NSPLIT 8",
        "#define PIPE 1",
        "#define QN 9",
        "#define QT 9",
        "#define SF 0",
        "#define STAGES 3",
        "#define TK 32",
        "#define WK 4",
        "#define WR 2",
    ]  # QT=0 (all nodes) renders as q_len
    assert head[12] == '#line 1 "verify_attention.cu"'


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_120"])
@pytest.mark.parametrize(
    "cfg,q_len",
    [
        (KernelConfig(nsplit=64, ht=8, tk=32, block=256), 9),
        (KernelConfig(nsplit=16, ht=1, tk=16, block=128, stages=3, wr=1, wk=4, sf=1, pipe=0), 1),
        (KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3), 9),  # the seesaw
    ],
)
def test_compiles_for_every_target(tmp_path, arch, cfg, q_len):
    built = compile_cubin(cfg, q_len, arch, tmp_path)
    assert built.cubin[:4] == b"\x7fELF" and not built.cached
    again = compile_cubin(cfg, q_len, arch, tmp_path)
    assert again.cached and again.cubin == built.cubin


SAMPLE = [(8, 9, 46000), (8, 1, 131072), (64, 9, 46000), (8, 9, 4096), (8, 64, 46000), (1, 33, 5000), (128, 16, 4096)]


#: The formats the .cu implements (its KV_FMT static_assert), whether or not the package serves them yet
#: (fp8_e4m3_qk: sm_89+ only, and fp8_ds_mla, at its own defaults: each checked on its own below).
KERNEL_FORMATS = ("bf16", "fp8_e4m3")


@needs_nvcc
@pytest.mark.parametrize("kv_dtype", KERNEL_FORMATS)
@pytest.mark.parametrize("device", ["a100", "h200", "rtx-pro-6000"])
@pytest.mark.parametrize("H, q_len, prefix", SAMPLE)
def test_default_configs_compile_without_spills_within_the_devices_smem(tmp_path, device, H, q_len, prefix, kv_dtype):
    """The heuristic defaults of a representative sample, built for the device's own arch (sm_80,
    sm_90, sm_120) and each cache format: no spills, and the kernel's own layout (kSmemBytes, via
    validate's formula) within its limit; the reduce built with it spills nothing either."""
    limits = known_device(device)
    cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=prefix)
    log = compile_cubin(cfg, q_len, limits.arch, tmp_path, kv_dtype=kv_dtype).ptxas_log
    report = ptxas_report(log)
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (cfg, report)
    assert 0 < report["registers"] <= 255
    for fn in ("verify_attn_reduce", "verify_attn_reduce16"):
        reduce = ptxas_report(log, fn)
        assert reduce["spill_stores"] == 0 and reduce["spill_loads"] == 0 and reduce["stack_frame"] == 0, (fn, reduce)
    assert smem_bytes(cfg, q_len, kv_dtype) <= limits.max_smem_optin


@needs_nvcc
@pytest.mark.parametrize("device", ["a100", "h200", "rtx-pro-6000"])
@pytest.mark.parametrize("H, q_len, prefix", SAMPLE)
def test_ds_mla_defaults_compile_without_spills(tmp_path, device, H, q_len, prefix):
    """fp8_ds_mla (FlashMLA's 656-byte rows: each token's 128-dim scales applied to its K and V
    fragments, the rope k-steps on bf16 MMAs) at each device's own defaults for it, with the
    conversion the arch has and with sm_80's bit placement: no spills, within the device's smem."""
    limits = known_device(device)
    cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=prefix, kv_dtype="fp8_ds_mla")
    for flags in ((), ("-DVA_F8_BITS",)):
        report = ptxas_report(compile_cubin(cfg, q_len, limits.arch, tmp_path, flags, kv_dtype="fp8_ds_mla").ptxas_log)
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (cfg, flags, report)
    assert smem_bytes(cfg, q_len, "fp8_ds_mla") <= limits.max_smem_optin


@needs_nvcc
@pytest.mark.parametrize("device", ["a100", "h200", "rtx-pro-6000"])
@pytest.mark.parametrize("H, q_len, prefix", SAMPLE)
def test_e4m3_with_sm80s_bit_placement_compiles_without_spills(tmp_path, device, H, q_len, prefix):
    """The e4m3 cache's sm_80 conversion (integer bit placement, VA_F8_BITS on newer archs) builds
    at each device's fp8 defaults without spills too."""
    limits = known_device(device)
    cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=prefix, kv_dtype="fp8_e4m3")
    built = compile_cubin(cfg, q_len, limits.arch, tmp_path, ("-DVA_F8_BITS",), kv_dtype="fp8_e4m3")
    report = ptxas_report(built.ptxas_log)
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (cfg, report)


@needs_nvcc
@pytest.mark.parametrize("H, q_len, prefix", SAMPLE)
def test_the_e4m3_qk_mode_compiles_without_spills_where_its_mma_is_native(tmp_path, H, q_len, prefix):
    """fp8_e4m3_qk at the RTX PRO 6000's defaults (sm_120: native e4m3 MMAs): no spills. (sm_90
    emulates them with f16 MMAs and needs more registers: its seesaw spills ~50 bytes; a
    correctness target there, never a speed one.)"""
    limits = known_device("rtx-pro-6000")
    cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=prefix, kv_dtype="fp8_e4m3")
    report = ptxas_report(compile_cubin(cfg, q_len, limits.arch, tmp_path, kv_dtype="fp8_e4m3_qk").ptxas_log)
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (cfg, report)


@needs_nvcc
def test_the_e4m3_qk_mode_does_not_build_without_e4m3_mmas(tmp_path):
    """sm_80 has no e4m3 MMA: validate refuses the format there by name, and the source refuses
    to build it, so no path emits an instruction the arch lacks."""
    cfg = KernelConfig(nsplit=64, ht=8, tk=32, block=256)
    with pytest.raises(CompileError, match="fp8_e4m3_qk.*compute capability 8.9"):
        compile_cubin(cfg, 9, "sm_80", tmp_path, kv_dtype="fp8_e4m3_qk")
    assert compile_cubin(cfg, 9, "sm_90", tmp_path, kv_dtype="fp8_e4m3_qk").cubin[:4] == b"\x7fELF"


@needs_nvcc
@pytest.mark.parametrize("device", ["h200", "rtx-pro-6000"])
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e4m3_qk"])
@pytest.mark.parametrize("H, q_len, prefix", [(8, 9, 46000), (64, 9, 46000), (8, 64, 46000)])
def test_q_rows_converted_together_compile_without_spills(tmp_path, device, kv_dtype, H, q_len, prefix):
    """VA_Q_ROWS=3 (the default) holds three q rows a warp in registers during the prologue: no
    spills at the e4m3 defaults of many-row shapes (sm_90's seesaw emulating e4m3 MMAs aside: it
    spills anyway)."""
    limits = known_device(device)
    if kv_dtype == "fp8_e4m3_qk" and limits.arch == "sm_90":
        pytest.skip("sm_90 emulates e4m3 MMAs: a correctness build, not a speed one")
    cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=prefix, kv_dtype=kv_dtype)
    built = compile_cubin(cfg, q_len, limits.arch, tmp_path, ("-DVA_Q_ROWS=3",), kv_dtype=kv_dtype)
    report = ptxas_report(built.ptxas_log)
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (cfg, report)


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
@pytest.mark.parametrize(
    "cfg",
    [
        KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=1, wk=2, sf=1, pipe=3),
        KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=2, wr=1, wk=4, sf=0, pipe=1),
    ],
)
def test_one_row_group_at_72_rows_builds_without_spills(tmp_path, arch, kv_dtype, cfg):
    """validate() admits 72 rows in one row group (9 row tiles a warp): its register estimate rests
    on these builds fitting 255 registers without spills."""
    assert check(cfg, known_device("h200"), H=8, q_len=9, kv_dtype=kv_dtype) is None
    report = ptxas_report(compile_cubin(cfg, 9, arch, tmp_path, kv_dtype=kv_dtype).ptxas_log)
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report


@needs_nvcc
def test_e4m3_builds_an_odd_count_of_o_tiles_a_warp(tmp_path):
    """32 warps hold one 16-dim tile of O^T each: PV's x2 .trans path, at 64 registers a thread."""
    cfg = KernelConfig(nsplit=32, ht=8, tk=64, block=1024, stages=2, wr=2, wk=4)
    built = compile_cubin(cfg, 2, "sm_90", tmp_path, kv_dtype="fp8_e4m3")
    report = ptxas_report(built.ptxas_log)
    assert report["spill_stores"] == 0 and report["registers"] <= 64, report


@needs_nvcc
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3", "fp8_e4m3_qk"])
@pytest.mark.parametrize(
    "cfg, q_len",
    [
        (KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3), 9),  # the seesaw
        (KernelConfig(nsplit=94, ht=4, tk=16, block=256, stages=2, wr=4, wk=2), 9),  # sm_120's H=8 q=9
        (KernelConfig(nsplit=16, ht=1, tk=16, block=128, stages=3, wr=1, wk=4, sf=1, pipe=0), 1),
        (KernelConfig(nsplit=8, ht=2, tk=64, block=512, stages=2, wr=2, wk=2, qt=5), 33),
    ],
)
def test_validates_shared_memory_formula_is_the_kernels_layout(tmp_path, cfg, q_len, kv_dtype):
    """validate.smem_bytes is what the .cu lays out (kSmemBytes), checked by the compiler's front end
    with a static_assert appended to the rendered source (no GPU: the launcher checks the same at
    load), per format."""
    import subprocess

    src = tmp_path / "k.cu"
    total = "SMEM_Q + SMEM_K + SMEM_S + SMEM_P + SMEM_STATS + SMEM_MASK + SMEM_SLOTS"
    want = smem_bytes(cfg, q_len, kv_dtype)
    src.write_text(render(cfg, q_len, kv_dtype) + f'\nstatic_assert({total} == {want}, "smem formula");\n')
    r = subprocess.run(["nvcc", "-cuda", "-arch=sm_90", "-std=c++17", "-o", str(tmp_path / "k.ii"), str(src)],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr[-1500:]


@needs_nvcc
def test_compile_error_is_typed(tmp_path):
    with pytest.raises(CompileError, match="nvcc failed"):
        compile_cubin(KernelConfig(nsplit=8, ht=1, tk=16, block=96), 1, "sm_90", tmp_path)  # BLOCK/32 must divide 32


@needs_nvcc
@pytest.mark.parametrize(
    "arch, flags, pdl",
    [("sm_80", (), False), ("sm_90", (), True), ("sm_120", (), True), ("sm_90", ("-DVA_NO_PDL",), False)],
)
def test_programmatic_dependent_launch_only_where_the_device_has_it(tmp_path, arch, flags, pdl):
    """griddepcontrol is sm_90+; kUsesPdl tells the launcher which launch the reduce needs."""
    import subprocess

    src = tmp_path / "k.cu"
    src.write_text(render(KernelConfig(nsplit=64, ht=8, tk=32, block=256), q_len=9))  # the default structure
    ptx = tmp_path / "k.ptx"
    subprocess.run(["nvcc", f"-arch={arch}", "-ptx", *flags, "-o", str(ptx), str(src)], check=True, capture_output=True)
    text = ptx.read_text()
    assert ("griddepcontrol.wait" in text) is pdl and ("griddepcontrol.launch_dependents" in text) is pdl
    assert ("kUsesPdl = 1" in text) is pdl


@needs_nvcc
@pytest.mark.parametrize(
    "flags, fits",
    [
        # row splits built in; their default grid: one row group, 4 k-slices (2 folded buffers of 24 rows)
        # in the 72-row score space
        (("-DVA_ROWSPLIT=3",), True),
        (("-DVA_ROWSPLIT=3", "-DVA_SPLIT_SF=0"), False),  # 4 unfolded buffers of 24 rows: 96 rows, more than 72
    ],
)
def test_a_row_splits_qk_grid_is_refused_when_its_score_buffers_do_not_fit(tmp_path, flags, fits):
    """The split's own QK grid (the seesaw at H=8 q=9) must fit its score buffers in the space the
    layout holds: a grid that does not is a compile error, not a kernel that overwrites its
    neighbours' scores."""
    cfg = KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3)
    if not fits:
        with pytest.raises(CompileError, match="VA_SPLIT_"):
            compile_cubin(cfg, 9, "sm_90", tmp_path, extra_flags=flags)
        return
    report = ptxas_report(compile_cubin(cfg, 9, "sm_90", tmp_path, extra_flags=flags).ptxas_log)
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (flags, report)
