"""Correctness of the compiled kernel against the fp32 reference, on the GPU."""

from __future__ import annotations

import pytest
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.validate import check

pytestmark = pytest.mark.gpu

CONFIG_POOL = [
    KernelConfig(nsplit=ns, ht=ht, tk=tk, block=blk, stages=st, qt=qt, wr=wr, wk=wk, sf=sf, pipe=pipe)
    for ns, tk, blk, st, wr, wk, sf, pipe in [
        (4, 32, 256, 2, 2, 4, 0, 1),  # split-K 4 (odd k-slices of 9 steps), two row groups
        (16, 16, 128, 3, 1, 4, 1, 0),  # four warps, folded scores, fused pipeline
        (64, 64, 512, 2, 2, 2, 0, 1),  # 16 warps: four token groups
        (1, 128, 256, 2, 1, 1, 0, 0),  # one split, eight token groups, no split-K
        (24, 32, 256, 4, 4, 2, 1, 1),  # deep ring, both k-slices in one score buffer
        (7, 32, 256, 3, 2, 2, 0, 0),  # odd NSPLIT: token-granular split edges
        (33, 32, 256, 4, 1, 4, 0, 0),  # bandwidth mode: one row group, deep ring
        (12, 64, 128, 2, 1, 2, 0, 1),  # four warps, two token groups of 32
        (132, 32, 256, 3, 2, 4, 1, 1),  # the compute-mode default structure
        (132, 32, 256, 3, 2, 2, 1, 3),  # seesaw: two groups alternate tiles, folded k-slices
        (7, 32, 256, 3, 4, 1, 0, 3),  # seesaw, four row groups, odd NSPLIT
        (5, 16, 256, 3, 1, 4, 0, 3),  # seesaw, 16-token tiles, split-K 4 per group
        (9, 32, 256, 3, 1, 2, 0, 3),  # seesaw, two token groups per group
    ]
    for ht in (1, 2, 8)
    for qt in (0, 3)
]
SHAPES = [(H, Q, B) for H in (8, 16, 64, 128) for Q in (1, 2, 9, 16) for B in (1, 3)]
PREFIXES = {1: [777], 3: [0, 1000, 37]}  # ragged, not multiples of TK, some splits empty


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    import pycuda.autoprimaryctx  # noqa: F401  (torch's primary context)
    import torch
    from verify_tuner.kernels.build import precompile
    from verify_tuner.kernels.limits import read_device_limits

    torch.cuda.init()
    limits, cache = read_device_limits(0), tmp_path_factory.mktemp("cubins")
    for q_len in sorted({Q for _, Q, _ in SHAPES} | {9}):  # nvcc in parallel, before the tests
        pool = sorted({c for c in CONFIG_POOL if any(check(c, limits, H=H, q_len=q_len) is None for H, _, _ in SHAPES)})
        assert not precompile(pool, q_len, limits.arch, cache)
    return limits, cache


def _run(cfg, inp, limits, cache, *, lse=True, flags=()):
    import torch
    from verify_tuner.kernels.launch import VerifyAttention

    B, Q, H, _ = inp.q.shape
    va = VerifyAttention(cfg, H=H, q_len=Q, limits=limits, max_batch=B, cache_dir=cache, extra_flags=flags)
    out = torch.full((B, Q, H, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse_t = torch.full((B, Q, H), float("nan"), dtype=torch.float32, device="cuda") if lse else None
    torch.cuda.synchronize()
    va(
        q=inp.q,
        kv=inp.kv,
        prefix_indices=inp.prefix_indices,
        prefix_indptr=inp.prefix_indptr,
        draft_indices=inp.draft_indices,
        tree_mask=inp.tree_mask,
        out=out,
        lse=lse_t,
        batch=B,
        softmax_scale=inp.scale,
    )
    torch.cuda.synchronize()
    return va, out, lse_t


@pytest.mark.parametrize(("H", "Q", "B"), SHAPES)
def test_matches_reference(gpu, H, Q, B):
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    configs = [c for c in CONFIG_POOL if check(c, limits, H=H, q_len=Q) is None]
    assert configs, "no config of the pool fits this shape"
    inp = make_inputs(prefix_lens=PREFIXES[B], q_len=Q, H=H, seed=H * 100 + Q * 10 + B, spare_slots=333)
    ref_o, ref_lse = reference(inp)
    for cfg in configs:
        _, out, lse = _run(cfg, inp, limits, cache)
        err = rel_error(out, ref_o)
        assert err <= 1e-2, f"{cfg}: rel error {err:.3g}"
        lse_err = rel_error(lse, ref_lse)
        assert lse_err <= 1e-3, f"{cfg}: lse rel error {lse_err:.3g}"


def test_long_prefix_many_tiles(gpu):
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    inp = make_inputs(prefix_lens=[46000], q_len=9, H=8, seed=7)
    ref_o, _ = reference(inp)
    for cfg in (
        KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=4, sf=1, pipe=1),
        KernelConfig(nsplit=7, ht=4, tk=32, block=256, stages=3, wr=2, wk=2, pipe=0),
        KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3),
        KernelConfig(nsplit=7, ht=8, tk=32, block=256, stages=3, wr=4, wk=1, pipe=3),
    ):
        _, out, _ = _run(cfg, inp, limits, cache, lse=False)
        assert rel_error(out, ref_o) <= 1e-2


@pytest.mark.parametrize(
    "cfg,H,Q",
    [
        # the sm_120 default's structure at H=8 q=9: 36 rows, row splits of 2 + 2 + 1 n8 tiles (a last split part-filled)
        (KernelConfig(nsplit=94, ht=4, tk=16, block=256, stages=2, wr=4, wk=2, pipe=1), 8, 9),
        # the seesaw at 40 rows: 2 + 2 + 1
        (KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3), 8, 5),
        # 32 rows, 4 n8 tiles: two splits of 2 (a third would be empty), so NSPLIT/2 parts
        (KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3), 8, 4),
    ],
    ids=["36-rows-pipe1", "40-rows-seesaw", "32-rows-two-splits"],
)
def test_row_splits_whose_last_split_is_short(gpu, cfg, H, Q):
    """Built with row splits (-DVA_ROWSPLIT=3, not the default), short batches run as row splits
    (kernels/plan.py); the blocks of the pool above have 1-4 or 9 n8 row tiles, whose splits are
    full; these are part-filled or, at 4 tiles, two instead of three."""
    from verify_tuner.kernels.plan import plan, row_splits
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error
    from verify_tuner.kernels.validate import shape

    limits, cache = gpu
    assert check(cfg, limits, H=H, q_len=Q) is None
    rows = shape(cfg, Q).rows
    for lens in ([0], [777], [1000, 0, 37]):
        rsplit = row_splits(rows=rows, nsplit=cfg.nsplit, splits=3)
        assert plan(lens, q_len=Q, tk=cfg.tk, nsplit=cfg.nsplit, rsplit=rsplit).split
        inp = make_inputs(prefix_lens=lens, q_len=Q, H=H, seed=len(lens) * 7 + Q, spare_slots=99)
        ref_o, ref_lse = reference(inp)
        _, out, lse = _run(cfg, inp, limits, cache, flags=("-DVA_ROWSPLIT=3",))
        assert rel_error(out, ref_o) <= 1e-2, (cfg, lens)
        assert rel_error(lse, ref_lse) <= 1e-3, (cfg, lens)


def test_cuda_graph_replay_matches(gpu):
    import pycuda.driver as cuda
    import torch
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    inp = make_inputs(prefix_lens=[5000, 123], q_len=9, H=16, seed=3)
    cfg = KernelConfig(nsplit=32, ht=8, tk=32, block=256, stages=3, wr=2, wk=4, sf=1, pipe=1)
    va = VerifyAttention(cfg, H=16, q_len=9, limits=limits, max_batch=2, cache_dir=cache)
    out = torch.full((2, 9, 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    stream = cuda.Stream()
    ext = torch.cuda.ExternalStream(stream.handle)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=ext):
        va(
            q=inp.q,
            kv=inp.kv,
            prefix_indices=inp.prefix_indices,
            prefix_indptr=inp.prefix_indptr,
            draft_indices=inp.draft_indices,
            tree_mask=inp.tree_mask,
            out=out,
            batch=2,
            softmax_scale=inp.scale,
            stream=stream,
        )
    assert torch.isnan(out.float()).all(), "capture must not execute the kernels"
    graph.replay()
    torch.cuda.synchronize()
    ref_o, _ = reference(inp)
    assert rel_error(out, ref_o) <= 1e-2
    inp.q.copy_(torch.randn_like(inp.q.float()).to(torch.bfloat16))  # replay reads the new inputs
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_error(out, reference(inp)[0]) <= 1e-2
