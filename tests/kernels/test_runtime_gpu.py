"""The runtime work plan on the GPU: one CUDA graph replayed while prefixes grow and requests come
and go, and ragged extremes, each checked against the fp32 reference with poisoned outputs."""

from __future__ import annotations

import pytest
from verify_tuner.kernels.config import KernelConfig

pytestmark = pytest.mark.gpu

H, Q = 8, 9
CONFIGS = [
    KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3),  # the default structure
    KernelConfig(nsplit=7, ht=4, tk=32, block=256, stages=3, wr=2, wk=2, pipe=0),  # few parts: many requests each
    KernelConfig(nsplit=48, ht=2, tk=16, block=128, stages=3, wr=1, wk=4, sf=1, pipe=0, qt=3),  # row tiles
]
#: A batch of 4 across the steps of a decode loop: prefixes grow across buckets, request 0
#: finishes and a new one starts at P=0 in its place, request 3 jumps past 100k. The first step's
#: tiles fit the default's grid (the tiled plan, kernels/plan.py); the others take the unit plan.
STEPS = [
    [30, 0, 37, 1000],
    [1000, 0, 37, 4096],
    [1009, 9, 500, 8000],
    [4000, 20, 46000, 8001],
    [0, 30, 46009, 16000],
    [9, 2000, 90000, 120000],
    [200, 2100, 131072, 0],
]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    import pycuda.autoprimaryctx  # noqa: F401  (torch's primary context)
    import torch
    from verify_tuner.kernels.build import precompile
    from verify_tuner.kernels.limits import read_device_limits

    torch.cuda.init()
    limits, cache = read_device_limits(0), tmp_path_factory.mktemp("cubins")
    assert not precompile(CONFIGS, Q, limits.arch, cache)
    return limits, cache


class Buffers:
    """Device buffers a graph captures once, sized for the largest step; each step copies new
    contents into them, as an engine refills its metadata before a replay."""

    def __init__(self, batch: int, max_tokens: int) -> None:
        import torch

        d = "cuda"
        self.q = torch.empty(batch, Q, H, 576, dtype=torch.bfloat16, device=d)
        self.kv = torch.empty(max_tokens + 1000, 576, dtype=torch.bfloat16, device=d)
        self.prefix_indices = torch.empty(max_tokens, dtype=torch.int32, device=d)
        self.prefix_indptr = torch.empty(batch + 1, dtype=torch.int32, device=d)
        self.draft_indices = torch.empty(batch, Q, dtype=torch.int32, device=d)
        self.tree_mask = torch.empty(batch, Q, dtype=torch.int64, device=d)
        self.out = torch.empty(batch, Q, H, 512, dtype=torch.bfloat16, device=d)
        self.lse = torch.empty(batch, Q, H, dtype=torch.float32, device=d)

    def load(self, inp) -> None:
        self.q.copy_(inp.q)
        self.kv[: inp.kv.shape[0]].copy_(inp.kv)
        self.prefix_indices[: inp.prefix_indices.numel()].copy_(inp.prefix_indices)
        self.prefix_indptr.copy_(inp.prefix_indptr)
        self.draft_indices.copy_(inp.draft_indices)
        self.tree_mask.copy_(inp.tree_mask)
        self.out.fill_(float("nan"))
        self.lse.fill_(float("nan"))


def _launch(va, buf: Buffers, scale: float, stream=None) -> None:
    va(
        q=buf.q,
        kv=buf.kv,
        prefix_indices=buf.prefix_indices,
        prefix_indptr=buf.prefix_indptr,
        draft_indices=buf.draft_indices,
        tree_mask=buf.tree_mask,
        out=buf.out,
        lse=buf.lse,
        batch=buf.q.shape[0],
        softmax_scale=scale,
        stream=stream,
    )


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_one_graph_follows_growing_prefixes_and_a_changing_batch(gpu, cfg):
    import pycuda.driver as cuda
    import torch
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    steps = [make_inputs(prefix_lens=lens, q_len=Q, H=H, seed=50 + i) for i, lens in enumerate(STEPS)]
    buf = Buffers(len(STEPS[0]), max(s.kv.shape[0] for s in steps))
    va = VerifyAttention(cfg, H=H, q_len=Q, limits=limits, max_batch=len(STEPS[0]), cache_dir=cache)
    stream = cuda.Stream()
    buf.load(steps[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.ExternalStream(stream.handle)):
        _launch(va, buf, steps[0].scale, stream)
    for i, inp in enumerate(steps):
        buf.load(inp)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        ref_o, ref_lse = reference(inp)
        assert rel_error(buf.out, ref_o) <= 1e-2, f"step {i} {STEPS[i]}: out"
        assert rel_error(buf.lse, ref_lse) <= 1e-3, f"step {i} {STEPS[i]}: lse"


EXTREMES = {
    "one 200k and 31 empty": [200_000] + [0] * 31,
    "all empty": [0] * 8,
    "B=256 of 1k": [1000] * 256,
    "one long among short": [100_000] + [2000] * 7,
}


def _check_poisoned(gpu, lens, configs, *, seed, spare_slots) -> None:
    """Each config's out and lse, poisoned with NaN first, against the fp32 reference on `lens`."""
    import torch
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    inp = make_inputs(prefix_lens=lens, q_len=Q, H=H, seed=seed, spare_slots=spare_slots)
    ref_o, ref_lse = reference(inp)
    for cfg in configs:
        va = VerifyAttention(cfg, H=H, q_len=Q, limits=limits, max_batch=len(lens), cache_dir=cache)
        out = torch.full((len(lens), Q, H, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((len(lens), Q, H), float("nan"), dtype=torch.float32, device="cuda")
        va.run(inp, out, lse=lse)
        torch.cuda.synchronize()
        assert rel_error(out, ref_o) <= 1e-2, f"{cfg}: out"
        assert rel_error(lse, ref_lse) <= 1e-3, f"{cfg}: lse"


#: Short batches around the tiled plan's edge at the default's 132 parts (TK=32, q_len 9): three
#: requests of 1000 (the unit plan gave a part two tiles), exactly 132 tiles, one tile more (the
#: unit plan), 40 requests of one tile each (more than a warp of requests), empty requests between.
TILED = {
    "3 x 1000": ([1000] * 3, True),
    "132 tiles": ([1047] * 4, True),
    "133 tiles": ([1047] * 3 + [1048], False),
    "40 one-tile requests": ([0, 5, 23] * 13 + [0], True),
    "empty between": ([2000, 0, 0, 1500, 0], True),
}


@pytest.mark.parametrize("case", TILED, ids=list(TILED))
def test_short_batches_on_either_side_of_the_tiled_plan(gpu, case):
    from verify_tuner.kernels.plan import plan

    lens, tiled = TILED[case]
    cfg = CONFIGS[0]
    assert plan(lens, q_len=Q, tk=cfg.tk, nsplit=cfg.nsplit).tiled is tiled
    _check_poisoned(gpu, lens, CONFIGS, seed=len(lens) + 5, spare_slots=31)


@pytest.mark.parametrize("case", EXTREMES, ids=list(EXTREMES))
def test_ragged_extremes(gpu, case):
    _check_poisoned(gpu, EXTREMES[case], CONFIGS[:2], seed=len(EXTREMES[case]), spare_slots=77)


def test_the_two_kernels_enqueued_apart_give_the_pairs_answer(gpu):
    """Benchmarks time each kernel alone (`partial=False` / `reduce=False`): the reduce enqueued by
    itself must merge what the partial left, so the split launch is the pair's answer, and a
    launch with neither kernel is our bug."""
    import torch
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.reference import make_inputs, reference, rel_error

    limits, cache = gpu
    lens = [46000, 3, 2000]  # one request over many parts, one part-held, one in between
    inp = make_inputs(prefix_lens=lens, q_len=Q, H=H, seed=5, spare_slots=11)
    ref_o, ref_lse = reference(inp)
    va = VerifyAttention(CONFIGS[0], H=H, q_len=Q, limits=limits, max_batch=len(lens), cache_dir=cache)
    out = torch.full((len(lens), Q, H, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((len(lens), Q, H), float("nan"), dtype=torch.float32, device="cuda")
    va.run(inp, out, lse=lse, reduce=False)
    torch.cuda.synchronize()
    assert torch.isnan(out[0]).all(), "the partial alone completed a request that several parts share"
    va.run(inp, out, lse=lse, partial=False)
    torch.cuda.synchronize()
    assert rel_error(out, ref_o) <= 1e-2 and rel_error(lse, ref_lse) <= 1e-3
    with pytest.raises(ValueError, match="neither kernel"):
        va.run(inp, out, reduce=False, partial=False)
