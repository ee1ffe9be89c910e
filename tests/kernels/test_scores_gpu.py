"""The kernel's scores themselves, read back, for every cache format and compute mode: at P=0 with
a mask where each draft node sees only itself, a row's lse is its one score, scale * q . k. They
must equal fp32 scores on what the kernel is asked to compute (the dequantized cache; q quantized
per row where QK runs on e4m3 MMAs) to fp32 rounding. The outputs' 1e-2 gate cannot see a score a
few hundredths off on a few rows: a reference whose q scale was one ulp off (two roundings) moved
266 of 4 608 scores by up to 0.14 while the battery's outputs stayed inside it
(bench/results/fp8_qk_scores_sm_90.md)."""

from __future__ import annotations

import pytest
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.validate import check

from tests.kernels.test_fp8_gpu import run_poisoned

pytestmark = pytest.mark.gpu

#: the lowest compute capability that runs each format (fp8_e4m3_qk's e4m3 MMAs need 8.9)
FORMATS = {"bf16": 80, "fp8_e4m3": 80, "fp8_e4m3_qk": 89}
CONFIGS = [
    KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3),  # the sm_90 default
    KernelConfig(nsplit=94, ht=4, tk=16, block=128, stages=2, wr=1, wk=4),  # the sm_120 default at H=8 q=9
    KernelConfig(nsplit=264, ht=8, tk=32, block=256, stages=2, wr=1, wk=4),  # the q_len 1 default
    KernelConfig(nsplit=48, ht=2, tk=16, block=128, stages=3, wr=1, wk=4, sf=1, pipe=0, qt=3),  # row tiles, odd k
]
SHAPES = [(8, 9), (8, 1), (16, 16)]
#: an absolute bound on a score (rms 3.5 here): fp32 rounding gives a few 1e-6, one e4m3 step of a
#: q value times its key a few 1e-2
ATOL = 5e-5


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    import pycuda.autoprimaryctx  # noqa: F401  (torch's primary context)
    import torch
    from verify_tuner.kernels.build import precompile
    from verify_tuner.kernels.limits import read_device_limits

    torch.cuda.init()
    limits, cache = read_device_limits(0), tmp_path_factory.mktemp("cubins")
    cc = 10 * limits.cc_major + limits.cc_minor
    for kv in (f for f, need in FORMATS.items() if cc >= need):
        for q_len in sorted({q for _, q in SHAPES}):
            pool = [
                c for c in CONFIGS if any(check(c, limits, H=H, q_len=q_len, kv_dtype=kv) is None for H, _ in SHAPES)
            ]
            assert not precompile(pool, q_len, limits.arch, cache, kv_dtype=kv)
    return limits, cache, cc


@pytest.mark.parametrize("kv_dtype", list(FORMATS))
@pytest.mark.parametrize(("H", "Q"), SHAPES, ids=str)
def test_each_score_is_fp32s_on_what_the_kernel_is_asked(gpu, kv_dtype, H, Q):
    from verify_tuner.kernels.reference import own_scores, quantized_q, score_inputs

    limits, cache, cc = gpu
    if cc < FORMATS[kv_dtype]:
        pytest.skip(f"{kv_dtype} needs compute capability {FORMATS[kv_dtype] / 10:.1f}")
    inp = score_inputs(batch=64, q_len=Q, H=H, seed=H + Q, kv_dtype=kv_dtype, scale=0.1447)
    want = own_scores(inp, quantized_q(inp.full_q(), kv_dtype))
    configs = [c for c in CONFIGS if check(c, limits, H=H, q_len=Q, kv_dtype=kv_dtype) is None]
    assert configs
    for cfg in configs:
        _, lse = run_poisoned(cfg, inp, limits, cache, kv_dtype=kv_dtype)
        err = (lse - want).abs()
        assert float(err.max()) <= ATOL, (
            f"{cfg}: {int((err > ATOL).sum())} of {err.numel()} scores off by up to {float(err.max()):.3g}"
        )
