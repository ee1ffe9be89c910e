"""The SGLang-interface backend with the real kernel: eager steps and a CUDA graph captured through
the backend's hooks (bench/engine_steps.py's engine: SGLang's order, its tensors, EAGLE trees in
each mask layout written where the draft stage writes them), SGLang's head-major q past 2048
tokens read in place, a DFlash chain replayed in a graph captured with a mask, and decode at
q_len 1 -- each checked against fp32 attention computed from SGLang's tensors."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture
def loop(monkeypatch, tmp_path):
    import torch
    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.kernels import runtime

    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))  # the op compiles its cubins here (nvcc)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import engine_loop
    import engine_steps

    limits = runtime.read_limits(0)
    pick = lambda q, bs: heuristic_config(limits, H=engine_steps.H, q_len=q, prefix=4096, batch=bs)
    return torch, engine_loop, engine_steps, pick


@pytest.mark.parametrize("mode", ["FULL_MASK", "QLEN_ONLY", "QLEN_ONLY_BITPACKING"])
def test_eager_steps_and_graph_replays_match_attention_on_sglang_s_tensors(loop, mode):
    torch, engine_loop, steps, pick = loop
    from verify_tuner.engine.tree_masks import TreeMaskMode

    sched = steps.Schedule([700, 0, 1440, 3000], [900, 80, 2100, 3200], seed=5)
    eng = steps.LoopEngine(sched, layers=3, device="cuda", pick_config=pick, mode=TreeMaskMode[mode])
    eng.prepare()
    eng.backend.init_forward_metadata(eng.fb)  # eager
    outs = [eng.backend.forward_extend(eng.q_nope, eng.k_nope, eng.k_nope, layer, eng.fb, q_rope=eng.q_rope,
                                       k_rope=eng.k_rope) for layer in eng.layers]  # fmt: skip
    assert all(eng.error(outs, i)[0] < 1e-2 for i in range(3))
    graph, outs = engine_loop.capture(eng)
    for step in range(30):  # requests finish and join at P=0 along the way
        eng.prepare()
        eng.out_graph()
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        rel, worst = eng.error(outs, step % 3)
        assert rel < 1e-2, (step, rel, worst)
        sched.advance()
    assert sched.joined >= 1


def test_sglang_s_head_major_q_past_2048_tokens_is_read_in_place(loop):
    _, _, steps, pick = loop
    from verify_tuner.engine.tree_masks import TreeMaskMode

    bs = 300  # 2700 tokens: the old 32-bit bound refused this q
    sched = steps.Schedule([64 + i for i in range(bs)], [400] * bs, seed=7)
    eng = steps.LoopEngine(sched, layers=1, device="cuda", pick_config=pick, mode=TreeMaskMode.QLEN_ONLY)
    eng.prepare()
    eng.backend.init_forward_metadata(eng.fb)
    assert eng.q_nope.stride() == (512, bs * steps.Q * 512, 1)
    outs = [eng.backend.forward_extend(eng.q_nope, eng.k_nope, eng.k_nope, eng.layers[0], eng.fb,
                                       q_rope=eng.q_rope, k_rope=eng.k_rope)]  # fmt: skip
    assert eng.error(outs, 0)[0] < 1e-2


def test_a_forward_compiled_by_torch_compile_matches_attention(loop):
    """SGLang's --enable-torch-compile: the verify forward compiled whole (inductor), the op on the kernel."""
    torch, _, steps, pick = loop
    from verify_tuner.engine.tree_masks import TreeMaskMode

    sched = steps.Schedule([700, 1440], [900, 2100], seed=11)
    eng = steps.LoopEngine(sched, layers=1, device="cuda", pick_config=pick, mode=TreeMaskMode.QLEN_ONLY)
    eng.prepare()
    eng.backend.init_forward_metadata(eng.fb)
    layer = eng.layers[0]

    def forward(q_nope, q_rope, k_nope, k_rope):
        return eng.backend.forward_extend(q_nope, k_nope, k_nope, layer, eng.fb, q_rope=q_rope, k_rope=k_rope)

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(forward, fullgraph=True)(eng.q_nope, eng.q_rope, eng.k_nope, eng.k_rope)
    torch._dynamo.reset()
    assert eng.error([out], 0)[0] < 1e-2


def test_a_dflash_chain_replays_in_a_graph_captured_with_a_mask(loop):
    torch, engine_loop, steps, pick = loop
    from verify_tuner.engine.tree_masks import TreeMaskMode

    sched = steps.Schedule([100, 2000], [300, 2200], seed=9)
    eng = steps.LoopEngine(sched, layers=2, device="cuda", pick_config=pick, mode=TreeMaskMode.QLEN_ONLY)
    eng.prepare()
    graph, outs = engine_loop.capture(eng)
    for step in range(6):
        eng.prepare()
        chain = step % 2 == 0
        if chain:  # DFlash verifies a linear block: custom_mask None
            eng.fb.spec_info.custom_mask, eng.masks = None, None
        eng.out_graph()
        graph.replay()
        torch.cuda.synchronize()
        assert eng.error(outs, step % 2)[0] < 1e-2, (step, chain)
        eng.fb.spec_info.custom_mask = eng.backend.verify_mask.buffer
        sched.advance()


def _decode(loop, lens: list[int], rows: list[int], layer, *, head_major_q: bool):
    """A decode step (q_len 1) after `lens` tokens through a fresh backend on the kernel, over a random req_to_token:
    the output as [B, H, 512] fp32, `want(f)` (fp32 attention over the pool's values times f, as
    SGLang's tensors give it), the pool's buffer, the step's slots and its k."""
    import types

    torch, _, _, pick = loop
    from verify_tuner.engine.sglang_backend import VerifyMLABackend

    from tests.engine.sglang_doubles import ForwardBatch, ForwardMode, MLAPool, sglang_attention

    B, H = len(lens), layer.tp_q_head_num
    pool = MLAPool(size=20_000, layers=1, device="cuda")
    req_to_token = torch.randperm(20_000, device="cuda").to(torch.int32).view(4, 5000)
    be = VerifyMLABackend(pool=pool, req_to_token=req_to_token, heads=H, q_lens=(1,), max_bs=4, max_context_len=5000,
                          pick_config=pick)  # fmt: skip
    loc = torch.stack([req_to_token[r, n] for r, n in zip(rows, lens)]).long()
    # as SGLang's prepare_for_decode leaves it: the step's slot at req_to_token[row, n], seq_lens n + 1
    fb = ForwardBatch(ForwardMode.DECODE, B, torch.tensor(lens, device="cuda") + 1, torch.tensor(rows, device="cuda"),
                      loc)  # fmt: skip
    be.init_forward_metadata(fb)
    if head_major_q:  # SGLang's absorbed q: [H, B, 512] transposed, read in place
        q = torch.randn(H, B, 512, device="cuda").to(torch.bfloat16).transpose(0, 1)
    else:
        q = torch.randn(B, H, 512, device="cuda").to(torch.bfloat16)
    q_rope = torch.randn(B, H, 64, device="cuda").to(torch.bfloat16)
    k = torch.randn(B, 1, 512, device="cuda").to(torch.bfloat16)
    k_rope = torch.randn(B, 1, 64, device="cuda").to(torch.bfloat16)
    out = be.forward_decode(q, k, k, layer, fb, q_rope=q_rope, k_rope=k_rope)
    stored = pool.get_key_buffer(0)

    def want(f: float) -> torch.Tensor:
        return sglang_attention(kv=stored.float() * f, req_to_token=req_to_token, fb=fb, q=torch.cat([q, q_rope], -1),
                                mode=0, q_len=1, scale=layer.scaling)  # fmt: skip

    return types.SimpleNamespace(out=out.view(B, H, 512).float(), want=want, stored=stored, loc=loc, k=k)


def test_decode_runs_at_q_len_1(loop):
    from verify_tuner.kernels.reference import rel_error

    from tests.engine.sglang_doubles import Layer

    step = _decode(loop, [4000, 0, 77], [2, 0, 1], Layer(0, 8, 0.1447), head_major_q=True)
    assert rel_error(step.out, step.want(1.0)) < 1e-2


@pytest.mark.parametrize("s", [1.0, 0.5])
def test_an_fp8_checkpoints_k_scale_over_a_bf16_pool_on_the_kernel(loop, s):
    """DeepSeek-V3 / Kimi K2 layers carry a k_scale with the default bf16 cache: the pool holds k / s
    and attention reads it back times s, which the bf16 kernel takes in its softmax scale and the
    backend applies to the output after it (a decode step: every row computed by the kernel)."""
    torch = loop[0]
    from verify_tuner.kernels.reference import rel_error

    from tests.engine.sglang_doubles import Layer

    layer = Layer(0, 8, 0.1447, k_scale=torch.tensor(s, device="cuda"), k_scale_float=s)
    step = _decode(loop, [3000, 0, 501], [1, 0, 2], layer, head_major_q=False)
    assert torch.equal(step.stored[step.loc, 0, :512], (step.k[:, 0] / s).to(torch.bfloat16))
    assert rel_error(step.out, step.want(s)) < 1e-2
    assert s == 1.0 or rel_error(step.out, step.want(1.0)) > 0.1  # the scale is not dropped


def test_a_graph_per_prefix_range_replays_as_the_longest_prefix_crosses_the_breakpoint(loop):
    """Two graphs for one batch size, each captured with its range's config under its attention
    variant; each step replays the one `select` gives, crossing the breakpoint both ways."""
    torch, engine_loop, steps, pick = loop
    from verify_tuner.engine import op
    from verify_tuner.engine.tree_masks import TreeMaskMode

    ranges = lambda q, bs: ((0, engine_loop.SHORT), (1000, pick(q, bs)))
    sched = steps.Schedule([960, 30, 700], [1040, 80, 900], seed=11)
    eng = steps.LoopEngine(sched, layers=2, device="cuda", pick_ranges=ranges, mode=TreeMaskMode.QLEN_ONLY)
    eng.prepare()
    graphs = {label: engine_loop.capture(eng, label) for label in eng.labels}
    assert eng.backend._config(steps.Q, 3, 1) == op.config_list(pick(steps.Q, 3))
    seen = set()
    for step in range(40):
        eng.prepare()
        label = eng.select()
        eng.out_graph()
        graph, outs = graphs[label]
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert eng.error(outs, step % 2)[0] < 1e-2, (step, label)
        seen.add((label, max(sched.lens) >= 1000))
        sched.advance()
    assert seen == {("prefix_range_0", False), ("prefix_range_1", True)}
