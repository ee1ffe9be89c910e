"""FlashMLA's "fp8 with scale" rows (kv_dtype fp8_ds_mla: 512 e4m3 latent dims, an fp32 scale for
each 128 of them, the 64 rope dims in bf16; 656 bytes a token) on the GPU, against the fp32
reference computed on the dequantized rows, with poisoned outputs: the e4m3 battery's structures and
shapes with both pool dtypes, sm_80's bit placement and the one-row q conversion, every layout the
op takes, a graph replayed over growing prefixes, ragged extremes, and blocks whose magnitudes
span the range the kernel's f16 operands hold (power-of-two scales, as UE8M0-style writers store them,
and amax / 448 ones)."""

from __future__ import annotations

import dataclasses

import pytest
from verify_tuner.kernels.validate import check

from tests.kernels.test_fp8_gpu import (
    BITS,
    CONFIGS,
    QROWS,
    RAGGED,
    SHAPES,
    battery,
    build_variant,
    in_layout,
    ragged,
    run_poisoned,
)

pytestmark = pytest.mark.gpu

FMT = "fp8_ds_mla"
#: bf16's gate on the dequantized rows (the e4m3 module's, which its helpers apply): the kernel
#: rounds each scaled value to f16 (11 bits) where the bf16 kernel reads values already rounded to
#: 8, and P and the fp32 sums as fp8_e4m3 does.
GATE, LSE_GATE = 1e-2, 1e-3


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    import pycuda.autoprimaryctx  # noqa: F401  (torch's primary context)
    import torch
    from verify_tuner.kernels.build import precompile
    from verify_tuner.kernels.limits import read_device_limits

    torch.cuda.init()
    limits, cache = read_device_limits(0), tmp_path_factory.mktemp("cubins")
    for q_len in sorted({q for _, q, _ in SHAPES}):  # (the build variants' extra shape is q_len 2 too)
        pool = [
            c for c in CONFIGS if any(check(c, limits, H=H, q_len=q_len, kv_dtype=FMT) is None for H in (8, 16, 64))
        ]
        for flags in ((), BITS, QROWS):
            assert not precompile(pool, q_len, limits.arch, cache, extra_flags=flags, kv_dtype=FMT)
    return limits, cache


@pytest.mark.parametrize("pool_dtype", ["uint8", "float8_e4m3fn"])
@pytest.mark.parametrize(("H", "Q", "lens"), SHAPES, ids=str)
def test_matches_the_reference_on_the_dequantized_rows(gpu, H, Q, lens, pool_dtype):
    battery(gpu, H, Q, lens, pool_dtype, FMT)


@pytest.mark.parametrize("flags", [BITS, QROWS], ids=["sm80_bits", "q_rows_1"])
@pytest.mark.parametrize(("H", "Q", "lens"), [*SHAPES, (64, 2, [3000, 0])], ids=str)
def test_each_build_variant_matches_the_reference(gpu, H, Q, lens, flags):
    """sm_80's bit placement (values times 2^-8, undone in each scale) and q a row at a time."""
    build_variant(gpu, H, Q, lens, flags, FMT)


@pytest.mark.parametrize("layout", ["flat", "req_to_token", "page64"])
def test_every_layout_the_op_takes(gpu, layout):
    in_layout(gpu, layout, FMT)


@pytest.mark.parametrize("lens", RAGGED, ids=len)
def test_ragged_extremes(gpu, lens):
    ragged(gpu, lens, FMT)


#: A batch of 3 over a decode loop (as the e4m3 module's): prefixes grow across buckets, a request
#: finishes and a new one joins at P=0, one passes 100k.
STEPS = [[100, 0, 2000], [1000, 0, 4096], [1009, 9, 8000], [0, 30, 46009], [9, 2000, 131072]]


def test_a_graph_follows_growing_prefixes(gpu):
    import pycuda.driver as cuda
    import torch
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    H, Q, B = 8, 9, len(STEPS[0])
    steps = [make_inputs(prefix_lens=lens, q_len=Q, H=H, seed=90 + i, kv_dtype=FMT) for i, lens in enumerate(STEPS)]
    kv = torch.zeros(max(s.kv.shape[0] for s in steps), 656, dtype=torch.uint8, device="cuda")
    idx = torch.zeros(max(s.prefix_indices.numel() for s in steps), dtype=torch.int32, device="cuda")
    first = steps[0]
    q, indptr = first.q.clone(), first.prefix_indptr.clone()
    draft, mask = first.draft_indices.clone(), first.tree_mask.clone()
    out = torch.empty(B, Q, H, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(B, Q, H, dtype=torch.float32, device="cuda")
    va = VerifyAttention(CONFIGS[0], H=H, q_len=Q, limits=limits, max_batch=B, cache_dir=cache, kv_dtype=FMT)
    stream = cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=torch.cuda.ExternalStream(stream.handle)):
        va(q=q, kv=kv, prefix_indices=idx, prefix_indptr=indptr, draft_indices=draft, tree_mask=mask, out=out,
           lse=lse, batch=B, softmax_scale=first.scale, stream=stream)  # fmt: skip
    for i, inp in enumerate(steps):
        kv[: inp.kv.shape[0]].copy_(inp.kv)
        idx[: inp.prefix_indices.numel()].copy_(inp.prefix_indices)
        q.copy_(inp.q), indptr.copy_(inp.prefix_indptr), draft.copy_(inp.draft_indices), mask.copy_(inp.tree_mask)
        out.fill_(float("nan")), lse.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        ref_o, ref_lse = reference(inp)
        assert rel_error(out, ref_o) <= GATE, f"step {i} {STEPS[i]}: out"
        assert rel_error(lse, ref_lse) <= LSE_GATE, f"step {i} {STEPS[i]}: lse"


@pytest.mark.parametrize("pow2_scales", [True, False], ids=["pow2", "amax_448"])
def test_blocks_of_every_magnitude_the_operands_hold(gpu, pow2_scales):
    """Each 128-dim block of each row, and each row's rope, scaled by 2^u, u uniform in [-8, 9]: block
    maxima from ~1e-2 to ~2e3, inside the 1.7e-3..4096 the kernel's f16 operands (scale times
    DS_UNIT) hold at full precision."""
    import torch
    from verify_tuner.kernels.reference import ds_mla_rows, make_inputs, reference, rel_error

    limits, cache = gpu
    inp = make_inputs(prefix_lens=[5000, 300], q_len=9, H=8, seed=5, spare_slots=40)
    gen = torch.Generator(device="cuda").manual_seed(6)
    blocks = torch.exp2(torch.randint(-8, 10, (inp.kv.shape[0], 5), generator=gen, device="cuda").float())
    widths = torch.tensor([128, 128, 128, 128, 64], device="cuda")
    src = (inp.kv.float() * torch.repeat_interleave(blocks, widths, dim=1)).to(torch.bfloat16)
    ds = dataclasses.replace(inp, kv=ds_mla_rows(src, pow2_scales=pow2_scales), kv_dtype=FMT, kv_unquantized=src)
    ref_o, ref_lse = reference(ds)
    for cfg in CONFIGS[:3]:
        out, lse = run_poisoned(cfg, ds, limits, cache, kv_dtype=FMT)
        assert rel_error(out, ref_o) <= GATE and rel_error(lse, ref_lse) <= LSE_GATE, cfg
