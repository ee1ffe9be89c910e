"""The SGLang-interface backend driven on the CPU as SGLang 0.5.23 drives it: eager steps, a
graph's capture-then-replay sequence of its metadata hooks, EAGLE trees in each mask layout,
DFlash chains, decode, the absorbed head-major q, the draft KV written before attention, and the
modes it hands to the Triton backend. The op is its fp32 reference (after the op's own layout
checks); the expected output is attention computed from SGLang's tensors directly, its mask read
in its own layout. tests/engine/test_sglang_backend_gpu.py runs the real kernel."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.engine.sglang_backend import VerifyMLABackend
from verify_tuner.engine.tree_masks import TreeMaskMode
from verify_tuner.kernels.reference import rel_error

from tests.engine.fake_driver import CFG
from tests.engine.sglang_doubles import (
    ForwardBatch,
    ForwardMode,
    Layer,
    MLAPool,
    ReferenceOp,
    SpecInfo,
    sglang_attention,
)
from tests.engine.sglang_trees import FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING, eagle_tree, sglang_mask

H, Q, SCALE = 8, 9, 0.1447  # Kimi K2's softmax scale (YaRN mscale folded in), not 576 ** -0.5
CTX, POOL = 256, 6000


class Engine:
    """One model runner's worth of state: the pool, req_to_token, the backend and its picks."""

    def __init__(
        self,
        mode: int,
        *,
        max_bs: int = 8,
        q_lens=(Q,),
        delegate=None,
        seed: int = 0,
        pool_dtype=torch.bfloat16,
        decodes: bool = True,
    ) -> None:
        self.pool = MLAPool(size=POOL, layers=2, dtype=pool_dtype)
        self.req_to_token = torch.zeros(max_bs + 2, CTX, dtype=torch.int32)
        self.picks: list[tuple[int, int]] = []
        self.backend = VerifyMLABackend(
            pool=self.pool, req_to_token=self.req_to_token, heads=H, q_lens=q_lens, max_bs=max_bs + 2,
            max_context_len=CTX, pick_config=lambda q, bs: self.picks.append((q, bs)) or CFG, delegate=delegate,
            tree_mask_mode=TreeMaskMode(mode), decodes=decodes,
        )  # fmt: skip
        self.backend.op = ReferenceOp()
        self.mode, self.rng, self.gen = mode, random.Random(seed), torch.Generator().manual_seed(seed)

    def step(self, lens: list[int], rows: list[int], *, topk: int = 4, q_len: int = Q, chain: bool = False):
        """A verify batch: each request's prefix and draft slots in its req_to_token row, trees drawn."""
        # slot 0 stays free, as in SGLang's pool: padded requests and tokens write there
        slots = (torch.randperm(POOL - 1, generator=self.gen)[: sum(lens) + len(lens) * q_len] + 1).to(torch.int32)
        at, loc = 0, []
        for n, row in zip(lens, rows):
            self.req_to_token[row, : n + q_len] = slots[at : at + n + q_len]
            loc.append(slots[at + n : at + n + q_len])
            at += n + q_len
        trees = [eagle_tree(topk=topk, depth=4, q_len=q_len, rng=self.rng) for _ in lens]
        mask = None if chain else sglang_mask(trees, lens, topk=topk, q_len=q_len, mode=self.mode)
        return ForwardBatch(
            ForwardMode.TARGET_VERIFY, len(lens), torch.tensor(lens), torch.tensor(rows),
            torch.cat(loc).long(), SpecInfo(mask, q_len, topk),
        )  # fmt: skip

    def decode(self, lens: list[int], rows: list[int]) -> ForwardBatch:
        """A decode step as SGLang lays it out: each request's `lens` tokens so far, the step's own slot
        after them in its req_to_token row, and seq_lens counting that token (prepare_for_decode adds
        1 before the step)."""
        fb = self.step(lens, rows, q_len=1, chain=True)
        return ForwardBatch(ForwardMode.DECODE, len(lens), fb.seq_lens + 1, fb.req_pool_indices, fb.out_cache_loc)

    def qkv(self, T: int, *, absorbed: bool = True):
        """SGLang's absorbed q: q_nope = bmm(...).transpose(0, 1), head-major; q_rope a slice of q."""
        g = self.gen
        q_nope = torch.randn(H, T, 512, generator=g).to(torch.bfloat16).transpose(0, 1)
        q_rope = torch.randn(T, H, 192, generator=g).to(torch.bfloat16)[..., 128:]
        k_nope = torch.randn(T, 1, 512, generator=g).to(torch.bfloat16)
        k_rope = torch.randn(T, 1, 64, generator=g).to(torch.bfloat16)
        return q_nope, q_rope, k_nope, k_rope

    def expected(self, fb: ForwardBatch, q_full: torch.Tensor, layer: Layer) -> torch.Tensor:
        kv = self.pool.get_key_buffer(layer.layer_id)
        q_len = fb.out_cache_loc.numel() // fb.batch_size
        return sglang_attention(
            kv=kv, req_to_token=self.req_to_token, fb=fb, q=q_full, mode=self.mode, q_len=q_len, scale=SCALE
        )


def _verify(eng: Engine, fb: ForwardBatch, layer: Layer) -> float:
    T = fb.out_cache_loc.numel()
    q_nope, q_rope, k_nope, k_rope = eng.qkv(T)
    out = eng.backend.forward_extend(q_nope, k_nope, k_nope, layer, fb, q_rope=q_rope, k_rope=k_rope)
    kv = eng.pool.get_key_buffer(layer.layer_id)
    assert torch.equal(kv[fb.out_cache_loc, 0, :512], k_nope[:, 0]) and torch.equal(
        kv[fb.out_cache_loc, 0, 512:], k_rope[:, 0]
    )
    want = eng.expected(fb, torch.cat([q_nope, q_rope], -1), layer)
    assert out.shape == (T, H * 512)
    return rel_error(out.view(T, H, 512), want)


@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
def test_an_eager_verify_step_matches_attention_on_sglang_s_own_tensors(mode):
    eng = Engine(mode)
    fb = eng.step([0, 37, 120, 5], rows=[3, 0, 7, 2])  # a request joining at P=0 among longer ones
    eng.backend.init_forward_metadata(fb)
    for layer_id in (0, 1):
        assert _verify(eng, fb, Layer(layer_id, H, SCALE)) < 1e-2
    calls = eng.backend.op.calls
    assert [c["scale"] for c in calls] == [SCALE, SCALE]
    assert calls[0]["q"].stride()[2] == 4 * Q * 512  # the head-major q read in place, not copied


def test_a_non_absorbed_q_of_576_is_read_as_it_is():
    eng = Engine(FULL_MASK)
    fb = eng.step([10, 64], rows=[1, 4])
    eng.backend.init_forward_metadata(fb)
    T = 2 * Q
    q = torch.randn(T, H * 576, generator=eng.gen).to(torch.bfloat16)
    k = torch.randn(T, 1, 576, generator=eng.gen).to(torch.bfloat16)
    out = eng.backend.forward_extend(q, k, k[..., :512], Layer(0, H, SCALE), fb)
    want = eng.expected(fb, q.view(T, H, 576), Layer(0, H, SCALE))
    assert rel_error(out.view(T, H, 512), want) < 1e-2


def _capture(eng: Engine, bs: int, static: ForwardBatch) -> ForwardBatch:
    """SGLang's capture: out_graph(in_capture=True) on the runner's buffers with a placeholder
    mask, then in_graph and the forward inside the capture. Returns the captured batch, whose
    tensors a replay refills."""
    be = eng.backend
    fb = ForwardBatch(
        ForwardMode.TARGET_VERIFY, bs, static.seq_lens[:bs], static.req_pool_indices[:bs],
        static.out_cache_loc[: bs * Q], SpecInfo(torch.ones(4096, dtype=torch.bool), Q, 4),
    )  # fmt: skip
    be.init_forward_metadata_out_graph(fb, in_capture=True)
    be.init_forward_metadata_in_graph(fb)
    return fb


def _replay(eng: Engine, captured: ForwardBatch, step: ForwardBatch, mask_into_source: bool) -> float:
    """SGLang's replay: the runner copies the step into its buffers, the draft stage writes the mask
    (into the backend's verify_mask when it fits), out_graph runs on the host, then the graph: the
    recorded in_graph ops and attention, on the captured tensors."""
    be, bs = eng.backend, step.batch_size
    captured.seq_lens.copy_(step.seq_lens)
    captured.req_pool_indices.copy_(step.req_pool_indices)
    captured.out_cache_loc.copy_(step.out_cache_loc)
    mask = step.spec_info.custom_mask
    if mask is not None and mask_into_source:
        be.verify_mask.buffer.view(torch.uint8)[: mask.numel() * mask.element_size()].copy_(mask.view(torch.uint8))
        mask = be.verify_mask.buffer
    live = ForwardBatch(step.forward_mode, bs, captured.seq_lens, captured.req_pool_indices, captured.out_cache_loc,
                        SpecInfo(mask, Q, 4))  # fmt: skip
    be.init_forward_metadata_out_graph(live)
    be.init_forward_metadata_in_graph(captured)  # what the graph replays: reads only the captured tensors
    step_view = ForwardBatch(
        step.forward_mode, bs, step.seq_lens, step.req_pool_indices, step.out_cache_loc, step.spec_info
    )
    return _verify(eng, step_view, Layer(0, H, SCALE))


@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
def test_a_captured_step_follows_every_replay_s_batch(mode):
    eng = Engine(mode, max_bs=4)
    be = eng.backend
    be.init_cuda_graph_state(4, 4 * Q)
    assert be.verify_mask.mode == mode and be.verify_mask.fits(4) and not be.verify_mask.fits(5)
    static = ForwardBatch(ForwardMode.TARGET_VERIFY, 4, torch.ones(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64),
                          torch.zeros(4 * Q, dtype=torch.int64))  # fmt: skip
    captured = _capture(eng, 3, static)
    for lens, into_source in (([0, 40, 7], True), ([9, 50, 16], False), ([100, 0, 25], True)):
        assert _replay(eng, captured, eng.step(lens, rows=[5, 1, 3]), into_source) < 1e-2


def test_a_chain_replays_in_a_graph_captured_with_a_mask():
    """DFlash verifies with custom_mask None; its graph was captured with the runner's placeholder."""
    eng = Engine(QLEN_ONLY, max_bs=4)
    eng.backend.init_cuda_graph_state(4, 4 * Q)
    static = ForwardBatch(ForwardMode.TARGET_VERIFY, 4, torch.ones(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64),
                          torch.zeros(4 * Q, dtype=torch.int64))  # fmt: skip
    captured = _capture(eng, 2, static)
    assert _replay(eng, captured, eng.step([30, 3], rows=[0, 1], chain=True), True) < 1e-2
    assert _replay(eng, captured, eng.step([31, 4], rows=[0, 1]), True) < 1e-2  # a tree again
    assert _replay(eng, captured, eng.step([35, 8], rows=[0, 1], chain=True), True) < 1e-2
