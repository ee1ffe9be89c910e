"""The e4m3 cache with a per-layer scale (kv_dtype fp8_e4m3) on the GPU, against the fp32 reference
computed on the dequantized cache (what the kernel is asked to compute), with poisoned outputs: the
structures of the bf16 pool, every layout the op takes, a graph replayed over growing prefixes with
the layer's scale recalibrated between replays, ragged extremes, and sm_80's bit-placement
conversion built on this GPU."""

from __future__ import annotations

import dataclasses

import pytest
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.validate import check

pytestmark = pytest.mark.gpu

FMT = "fp8_e4m3"
#: The gate of the bf16 kernel, on the dequantized cache: dequantizing is exact (e4m3 in f16), so
#: the kernel's own rounding (P and q in f16, fp32 sums) is all that separates the two.
GATE, LSE_GATE = 1e-2, 1e-3
CONFIGS = [
    KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3),  # the sm_90 default
    KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, pipe=3),  # e4m3's: unfolded scores fit
    KernelConfig(nsplit=94, ht=4, tk=16, block=256, stages=2, wr=4, wk=2),  # the sm_120 default at H=8 q=9
    KernelConfig(nsplit=7, ht=4, tk=32, block=256, stages=3, wr=2, wk=2, pipe=0),  # fused pipeline, few parts
    KernelConfig(nsplit=48, ht=2, tk=16, block=128, stages=3, wr=1, wk=4, sf=1, pipe=0, qt=3),  # row tiles
    KernelConfig(nsplit=264, ht=8, tk=32, block=256, stages=2, wr=1, wk=4),  # the q_len 1 default
    KernelConfig(nsplit=64, ht=8, tk=64, block=512, stages=2, wr=2, wk=2),  # 16 warps, one token each
    # 32 warps: one 16-dim tile of O^T a warp, PV's odd-count path (an x2 .trans); and two configs
    # only e4m3's halved ring fits (64-token tiles at 72 rows; three slots of 64 at q=1)
    KernelConfig(nsplit=32, ht=8, tk=64, block=1024, stages=2, wr=2, wk=4),
    KernelConfig(nsplit=132, ht=8, tk=64, block=256, stages=2, wr=2, wk=2),
    KernelConfig(nsplit=264, ht=8, tk=64, block=256, stages=3, wr=1, wk=4),
]
BITS = ("-DVA_F8_BITS",)  # sm_80's bit placement, built for this GPU
QROWS = ("-DVA_Q_ROWS=1",)  # q converted a row a warp at a time (the served build takes three at once)
SHAPES = [(8, 9, [46000]), (8, 1, [131072]), (16, 9, [0, 1000, 37]), (64, 2, [777]), (8, 16, [5000, 3])]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    import pycuda.autoprimaryctx  # noqa: F401  (torch's primary context)
    import torch
    from verify_tuner.kernels.build import precompile
    from verify_tuner.kernels.limits import read_device_limits

    torch.cuda.init()
    limits, cache = read_device_limits(0), tmp_path_factory.mktemp("cubins")
    for q_len in sorted({q for _, q, _ in SHAPES}):
        pool = [
            c for c in CONFIGS if any(check(c, limits, H=H, q_len=q_len, kv_dtype=FMT) is None for H, _, _ in SHAPES)
        ]
        for flags in ((), BITS, QROWS):  # the served build (cvt), sm_80's bit placement, a q row at a time
            assert not precompile(pool, q_len, limits.arch, cache, extra_flags=flags, kv_dtype=FMT)
    return limits, cache


def run_poisoned(cfg, inp, limits, cache, *, flags=(), kv_dtype=FMT):
    """(out, lse) of one launch of `cfg` on `inp`, both poisoned with NaN first."""
    import torch
    from verify_tuner.kernels.launch import VerifyAttention

    B, Q, H, _ = inp.q.shape
    va = VerifyAttention(
        cfg, H=H, q_len=Q, limits=limits, max_batch=B, cache_dir=cache, extra_flags=flags, kv_dtype=kv_dtype
    )
    out = torch.full((B, Q, H, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((B, Q, H), float("nan"), dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    va.run(inp, out, lse=lse)
    torch.cuda.synchronize()
    return out, lse


def battery(gpu, H, Q, lens, pool_dtype, fmt=FMT):
    """Every config of CONFIGS valid for the shape, against the reference on the dequantized cache."""
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    inp = make_inputs(prefix_lens=lens, q_len=Q, H=H, seed=H + Q, spare_slots=91, kv_dtype=fmt, pool_dtype=pool_dtype)
    ref_o, ref_lse = reference(inp)
    unq_o, _ = reference(dataclasses.replace(inp, kv=inp.kv_unquantized, kv_dtype="bf16", kv_scale=1.0))
    configs = [c for c in CONFIGS if check(c, limits, H=H, q_len=Q, kv_dtype=fmt) is None]
    assert configs
    for cfg in configs:
        out, lse = run_poisoned(cfg, inp, limits, cache, kv_dtype=fmt)
        assert rel_error(out, ref_o) <= GATE, f"{cfg}: out"
        assert rel_error(lse, ref_lse) <= LSE_GATE, f"{cfg}: lse"
        # information for users, not the gate: the error the cache's quantization itself adds
        print(f"{fmt} {cfg} H={H} q={Q} {lens}: vs dequantized {rel_error(out, ref_o):.2e}, "
              f"vs the unquantized cache {rel_error(out, unq_o):.2e}")  # fmt: skip


@pytest.mark.parametrize("pool_dtype", ["uint8", "float8_e4m3fn"])
@pytest.mark.parametrize(("H", "Q", "lens"), SHAPES, ids=str)
def test_matches_the_reference_on_the_dequantized_cache(gpu, H, Q, lens, pool_dtype):
    battery(gpu, H, Q, lens, pool_dtype)


@pytest.mark.parametrize("flags", [BITS, QROWS], ids=["sm80_bits", "q_rows_1"])
@pytest.mark.parametrize(("H", "Q", "lens"), [*SHAPES, (64, 2, [3000, 0])], ids=str)
def test_each_build_variant_matches_the_reference(gpu, H, Q, lens, flags):
    """The builds beside the served one, on every config and shape: sm_80's bit placement
    (VA_F8_BITS: sm_80 has no fp8 conversion, so the kernel places the bits, times 2^-8 undone with
    the scale) and VA_Q_ROWS=1 (each warp converts one q row at a time, where the served build
    loads and reduces three before converting them in place)."""
    build_variant(gpu, H, Q, lens, flags)


def build_variant(gpu, H, Q, lens, flags, fmt=FMT):
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    inp = make_inputs(prefix_lens=lens, q_len=Q, H=H, seed=H + Q + 7, spare_slots=33, kv_dtype=fmt)
    ref_o, ref_lse = reference(inp)
    configs = [c for c in CONFIGS if check(c, limits, H=H, q_len=Q, kv_dtype=fmt) is None]
    assert configs
    for cfg in configs:
        out, lse = run_poisoned(cfg, inp, limits, cache, flags=flags, kv_dtype=fmt)
        assert rel_error(out, ref_o) <= GATE, f"{cfg} {flags}: out"
        assert rel_error(lse, ref_lse) <= LSE_GATE, f"{cfg} {flags}: lse"


@pytest.mark.parametrize("layout", ["flat", "req_to_token", "page64"])
def test_every_layout_the_op_takes(gpu, layout):
    in_layout(gpu, layout)


def in_layout(gpu, layout, fmt=FMT):
    """The default config on a ragged batch in one of the layouts the op takes (q split as SGLang's)."""
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    kw = {"flat": {}, "req_to_token": {"req_to_token": True}, "page64": {"page_size": 64}}[layout]
    inp = make_inputs(prefix_lens=[3000, 0, 129], q_len=9, H=8, seed=64, split_q=True, kv_dtype=fmt, **kw)
    ref_o, ref_lse = reference(inp)
    out, lse = run_poisoned(CONFIGS[0], inp, limits, cache, kv_dtype=fmt)
    assert rel_error(out, ref_o) <= GATE and rel_error(lse, ref_lse) <= LSE_GATE


#: A batch of 3 over a decode loop: prefixes grow across buckets, request 0 finishes and a new one
#: joins at P=0, request 2 passes 100k; the first step's tiles fit the default's grid (the tiled plan).
STEPS = [[100, 0, 2000], [1000, 0, 4096], [1009, 9, 8000], [0, 30, 46009], [9, 2000, 131072]]


def test_a_graph_follows_growing_prefixes_and_a_recalibrated_scale(gpu):
    """One graph captured with the layer's scale in a device tensor: each step refills the buffers
    and rewrites the scale (an engine recalibrating k_scale), and the replay follows both."""
    import pycuda.driver as cuda
    import torch
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    H, Q, B = 8, 9, len(STEPS[0])
    steps = [make_inputs(prefix_lens=lens, q_len=Q, H=H, seed=90 + i, kv_dtype=FMT) for i, lens in enumerate(STEPS)]
    rows = max(s.kv.shape[0] for s in steps)
    kv = torch.zeros(rows, 576, dtype=torch.uint8, device="cuda")
    idx = torch.zeros(max(s.prefix_indices.numel() for s in steps), dtype=torch.int32, device="cuda")
    first = steps[0]
    q, indptr = first.q.clone(), first.prefix_indptr.clone()
    draft, mask = first.draft_indices.clone(), first.tree_mask.clone()
    scale = torch.tensor(1.0, dtype=torch.float32, device="cuda")  # 0-d: the engine's layer.k_scale
    out = torch.empty(B, Q, H, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(B, Q, H, dtype=torch.float32, device="cuda")
    va = VerifyAttention(CONFIGS[0], H=H, q_len=Q, limits=limits, max_batch=B, cache_dir=cache, kv_dtype=FMT)
    stream = cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=torch.cuda.ExternalStream(stream.handle)):
        va(q=q, kv=kv, prefix_indices=idx, prefix_indptr=indptr, draft_indices=draft, tree_mask=mask, out=out,
           lse=lse, batch=B, softmax_scale=first.scale, stream=stream, kv_scale=123.0, kv_scale_ptr=scale)  # fmt: skip
    for i, inp in enumerate(steps):
        for recalibrated in (1.0, 0.5):  # the same bytes under a scale the engine halved
            kv[: inp.kv.shape[0]].copy_(inp.kv)
            idx[: inp.prefix_indices.numel()].copy_(inp.prefix_indices)
            q.copy_(inp.q), indptr.copy_(inp.prefix_indptr), draft.copy_(inp.draft_indices), mask.copy_(inp.tree_mask)
            scale.fill_(inp.kv_scale * recalibrated)
            out.fill_(float("nan")), lse.fill_(float("nan"))
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
            ref_o, ref_lse = reference(dataclasses.replace(inp, kv_scale=inp.kv_scale * recalibrated))
            assert rel_error(out, ref_o) <= GATE, f"step {i} {STEPS[i]} x{recalibrated}: out"
            assert rel_error(lse, ref_lse) <= LSE_GATE, f"step {i} {STEPS[i]} x{recalibrated}: lse"


RAGGED = [[200_000] + [0] * 31, [0] * 8, [1000] * 256, [100_000] + [2000] * 7]


@pytest.mark.parametrize("lens", RAGGED, ids=len)
def test_ragged_extremes(gpu, lens):
    ragged(gpu, lens)


def ragged(gpu, lens, fmt=FMT):
    """The first three configs over a ragged batch (one long request among empty ones, many short)."""
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    inp = make_inputs(prefix_lens=lens, q_len=9, H=8, seed=len(lens), spare_slots=77, kv_dtype=fmt)
    ref_o, ref_lse = reference(inp)
    for cfg in CONFIGS[:3]:
        out, lse = run_poisoned(cfg, inp, limits, cache, kv_dtype=fmt)
        assert rel_error(out, ref_o) <= GATE and rel_error(lse, ref_lse) <= LSE_GATE, cfg
