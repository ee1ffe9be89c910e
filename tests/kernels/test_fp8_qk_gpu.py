"""kv_dtype fp8_e4m3_qk on the GPU: the e4m3 cache with QK on e4m3 MMAs (q quantized per row), PV
on f16 after dequantizing V in registers. Gated against the fp32 reference on what the kernel is
asked to compute (the dequantized cache, q quantized per row as the prologue does) as strictly as
bf16; the error against the unquantized cache and q is printed for users. On sm_90 the e4m3 MMA is
emulated (correct, not fast); on sm_89 and sm_120 it is native."""

from __future__ import annotations

import dataclasses

import pytest
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.validate import check

from tests.kernels.test_fp8_gpu import QROWS, run_poisoned

pytestmark = pytest.mark.gpu

FMT = "fp8_e4m3_qk"
GATE, LSE_GATE = 1e-2, 1e-3
CONFIGS = [
    KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3),  # the sm_90 default
    KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, pipe=3),  # e4m3's: unfolded scores fit
    KernelConfig(nsplit=94, ht=4, tk=16, block=128, stages=2, wr=1, wk=4),  # the sm_120 default at H=8 q=9
    KernelConfig(nsplit=7, ht=4, tk=32, block=256, stages=3, wr=2, wk=2, pipe=0),  # fused pipeline
    KernelConfig(nsplit=48, ht=2, tk=16, block=128, stages=3, wr=1, wk=4, sf=1, pipe=0, qt=3),  # row tiles, odd k
    KernelConfig(nsplit=264, ht=8, tk=32, block=256, stages=2, wr=1, wk=4),  # the q_len 1 default
    KernelConfig(nsplit=64, ht=8, tk=64, block=512, stages=2, wr=2, wk=2),  # 16 warps, one token tile each
]
SHAPES = [(8, 9, [46000]), (8, 1, [131072]), (16, 9, [0, 1000, 37]), (64, 2, [777]), (8, 16, [5000, 3])]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    import pycuda.autoprimaryctx  # noqa: F401  (torch's primary context)
    import torch
    from verify_tuner.kernels.build import precompile
    from verify_tuner.kernels.limits import read_device_limits

    torch.cuda.init()
    limits, cache = read_device_limits(0), tmp_path_factory.mktemp("cubins")
    major, minor = torch.cuda.get_device_capability(0)
    if 10 * major + minor < 89:
        pytest.skip("e4m3 MMAs need compute capability 8.9+ (validate refuses the format here)")
    for q_len in sorted({q for _, q, _ in SHAPES}):  # in parallel, not one by one in the tests
        pool = [
            c for c in CONFIGS if any(check(c, limits, H=H, q_len=q_len, kv_dtype=FMT) is None for H, _, _ in SHAPES)
        ]
        assert not precompile(pool, q_len, limits.arch, cache, kv_dtype=FMT)
    assert not precompile(CONFIGS[:2], 9, limits.arch, cache, extra_flags=QROWS, kv_dtype=FMT)
    return limits, cache


@pytest.mark.parametrize(("H", "Q", "lens"), SHAPES, ids=str)
def test_matches_the_reference_with_q_quantized_per_row(gpu, H, Q, lens):
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    inp = make_inputs(prefix_lens=lens, q_len=Q, H=H, seed=H + Q + 11, spare_slots=91, kv_dtype=FMT)
    ref_o, ref_lse = reference(inp)
    unq_o, _ = reference(dataclasses.replace(inp, kv=inp.kv_unquantized, kv_dtype="bf16", kv_scale=1.0))
    configs = [c for c in CONFIGS if check(c, limits, H=H, q_len=Q, kv_dtype=FMT) is None]
    assert configs
    for cfg in configs:
        out, lse = run_poisoned(cfg, inp, limits, cache, kv_dtype=FMT)
        assert rel_error(out, ref_o) <= GATE, f"{cfg}: out {rel_error(out, ref_o):.3g}"
        assert rel_error(lse, ref_lse) <= LSE_GATE, f"{cfg}: lse {rel_error(lse, ref_lse):.3g}"
        print(f"{cfg} H={H} q={Q} {lens}: vs its reference {rel_error(out, ref_o):.2e}, "
              f"vs the unquantized cache and q {rel_error(out, unq_o):.2e}")  # fmt: skip


@pytest.mark.parametrize("layout", ["req_to_token", "page64"])
def test_the_op_layouts(gpu, layout):
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    kw = {"req_to_token": {"req_to_token": True}, "page64": {"page_size": 64}}[layout]
    inp = make_inputs(prefix_lens=[3000, 0, 129], q_len=9, H=8, seed=65, split_q=True, kv_dtype=FMT, **kw)
    ref_o, ref_lse = reference(inp)
    out, lse = run_poisoned(CONFIGS[0], inp, limits, cache, kv_dtype=FMT)
    assert rel_error(out, ref_o) <= GATE and rel_error(lse, ref_lse) <= LSE_GATE


@pytest.mark.parametrize("lens", [[46000], [0, 1000, 37]], ids=str)
def test_q_rows_quantized_one_at_a_time_match_the_reference(gpu, lens):
    """VA_Q_ROWS=1: a q row a warp read, reduced and rewritten as e4m3 in place at a time (the
    served build takes three at once)."""
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    inp = make_inputs(prefix_lens=lens, q_len=9, H=8, seed=19, spare_slots=7, kv_dtype=FMT)
    ref_o, ref_lse = reference(inp)
    for cfg in CONFIGS[:2]:
        out, lse = run_poisoned(cfg, inp, limits, cache, flags=QROWS, kv_dtype=FMT)
        assert rel_error(out, ref_o) <= GATE and rel_error(lse, ref_lse) <= LSE_GATE, cfg
