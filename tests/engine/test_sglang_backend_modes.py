"""The SGLang-interface backend's other duties on the CPU: decode at q_len 1, the modes it hands to
SGLang's Triton backend, one workspace for every captured batch size and layer, configs fixed at
capture, a mask the draft stage writes after the metadata was planned, and the mistakes it names."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.engine import op
from verify_tuner.engine.sglang_backend import VerifyMLABackend
from verify_tuner.engine.tree_masks import TreeMaskMode
from verify_tuner.kernels.reference import rel_error

from tests.engine.fake_driver import CFG
from tests.engine.sglang_doubles import Delegate, ForwardBatch, ForwardMode, Layer, MLAPool, SpecInfo, sglang_attention
from tests.engine.sglang_trees import FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING
from tests.engine.test_sglang_backend import SCALE, Engine, H, Q, _verify


def test_decode_runs_at_q_len_1():
    """Short contexts, where reading the step's own token twice (once as the last of seq_lens, once
    as the step's slot) would move the output far past the bound."""
    eng = Engine(QLEN_ONLY, q_lens=(1,))
    fb = eng.decode([50, 0, 2], [2, 0, 1])
    eng.backend.init_forward_metadata(fb)
    T = 3
    q_nope, q_rope, k_nope, k_rope = eng.qkv(T)
    out = eng.backend.forward_decode(q_nope, k_nope, k_nope, Layer(1, H, SCALE), fb, q_rope=q_rope, k_rope=k_rope)
    want = eng.expected(fb, torch.cat([q_nope, q_rope], -1), Layer(1, H, SCALE))
    assert rel_error(out.view(T, H, 512), want) < 1e-2


def test_prefill_goes_to_the_triton_backend_as_it_takes_it():
    """Prefill and mixed batches: metadata and forward to the delegate; an absorbed q (the backend is
    registered as taking q_rope) is joined into the 576-wide q and k the Triton backend reads."""
    tri = Delegate()
    eng = Engine(QLEN_ONLY, delegate=tri)
    fb = ForwardBatch(ForwardMode.EXTEND, 2, torch.tensor([5, 7]), torch.tensor([0, 1]), torch.arange(12))
    eng.backend.init_forward_metadata(fb)
    q_nope, q_rope, k_nope, k_rope = eng.qkv(12)
    layer = Layer(0, H, SCALE)
    assert eng.backend.forward_extend(q_nope, k_nope, k_nope, layer, fb, q_rope=q_rope, k_rope=k_rope) == (
        "delegated forward_extend"
    )
    (name0, (fb0,)), (name1, args) = tri.calls
    assert (name0, fb0, name1) == ("init_forward_metadata", fb, "forward_extend")
    q, k, v, got_layer, got_fb, save = args
    assert got_layer is layer and got_fb is fb
    assert q.shape == (12, H, 576) and torch.equal(q[..., :512], q_nope) and torch.equal(q[..., 512:], q_rope)
    assert k.shape == (12, 1, 576) and torch.equal(k[..., 512:], k_rope) and v is k_nope and save is True
    assert eng.backend.op.calls == []


def test_an_eager_mask_update_repacks_only_a_step_planned_before_it(monkeypatch):
    """SGLang 0.5.23 calls the update before an eager verify's metadata (planned in its forward): the
    last step, already run, is not packed again; a step planned before its mask is (older order)."""
    eng = Engine(QLEN_ONLY)
    one = eng.step([12, 30], rows=[0, 1])
    eng.backend.init_forward_metadata(one)
    assert _verify(eng, one, Layer(0, H, SCALE)) < 1e-2
    step, packs = eng.backend.steps[Q], []
    pack = step.pack
    monkeypatch.setattr(step, "pack", lambda bs, *a, **k: packs.append(bs) or pack(bs, *a, **k))
    two = eng.step([5], rows=[2])
    eng.backend.update_verify_buffers_to_fill_after_draft(two.spec_info, None)
    assert packs == []
    eng.backend.init_forward_metadata(two)
    eng.backend.update_verify_buffers_to_fill_after_draft(two.spec_info, None)  # planned, not run: again
    assert packs == [1, 1] and _verify(eng, two, Layer(0, H, SCALE)) < 1e-2


def test_an_idle_dp_rank_s_replay_copies_no_mask():
    """An idle rank replays the captured verify graph on padding: SGLang's view keeps the captured
    mode and hands the runner's all-ones mask, which is not staged (FULL_MASK's is tens of MB)."""
    eng = Engine(FULL_MASK)
    be = eng.backend
    be.init_cuda_graph_state(4, 4 * Q)
    real = eng.step([7, 9, 3, 5], rows=[0, 1, 2, 3])
    be.init_forward_metadata_out_graph(real, in_capture=True)
    be.init_forward_metadata_out_graph(real)
    before = be.verify_mask.buffer.clone()
    z = {"dtype": torch.int64}
    ones = torch.ones(before.numel(), dtype=torch.bool)
    idle = ForwardBatch(ForwardMode.TARGET_VERIFY, 4, torch.ones(4, **z), torch.zeros(4, **z), torch.zeros(4 * Q, **z),
                        SpecInfo(ones, Q, 4), actual_forward_mode=ForwardMode.IDLE)  # fmt: skip
    be.init_forward_metadata_out_graph(idle)
    be.update_verify_buffers_to_fill_after_draft(idle.spec_info, 4)
    assert torch.equal(be.verify_mask.buffer, before) and int(be.steps[Q].chain) == 1
    idle.spec_info = None  # SGLang allows an idle rank's view without one
    be.init_forward_metadata_out_graph(idle)
    nxt = eng.step([30, 2, 11, 40], rows=[0, 1, 2, 3])  # the next real step: other lengths, other trees
    be.init_forward_metadata_out_graph(nxt)
    be.update_verify_buffers_to_fill_after_draft(nxt.spec_info, 4)
    staged = nxt.spec_info.custom_mask.reshape(-1).view(torch.uint8)
    assert int(be.steps[Q].chain) == 0 and not torch.equal(staged, before.view(torch.uint8)[: staged.numel()])
    assert torch.equal(be.verify_mask.buffer.view(torch.uint8)[: staged.numel()], staged)


def test_a_pd_prefill_node_s_decode_warm_up_goes_to_the_triton_backend():
    """A speculative PD prefill node's target verifies nothing, and its only decode is SGLang's
    flashinfer-autotune warm-up (a DECODE forward; the backend has no q_len-1 step there): metadata and
    forward go to Triton, the absorbed q joined; a verify step still runs on the kernel."""
    tri = Delegate()
    eng = Engine(QLEN_ONLY, delegate=tri, decodes=False)
    fb = eng.decode([5, 7], [0, 1])
    eng.backend.init_forward_metadata(fb)
    q_nope, q_rope, k_nope, k_rope = eng.qkv(2)
    got = eng.backend.forward_decode(q_nope, k_nope, k_nope, Layer(0, H, SCALE), fb, q_rope=q_rope, k_rope=k_rope)
    assert got == "delegated forward_decode" and [n for n, _ in tri.calls] == [
        "init_forward_metadata",
        "forward_decode",
    ]
    q, k = tri.calls[1][1][:2]
    assert q.shape == (2, H, 576) and torch.equal(q[..., 512:], q_rope) and k.shape == (2, 1, 576)
    assert eng.backend.op.calls == []
    step = eng.step([40], rows=[2])
    eng.backend.init_forward_metadata(step)
    assert _verify(eng, step, Layer(0, H, SCALE)) < 1e-2 and len(eng.backend.op.calls) == 1
    # where the backend decodes, a decode it has no step for stops loudly
    with pytest.raises(ValueError, match="a step of q_len 1"):
        Engine(QLEN_ONLY, delegate=Delegate()).backend.init_forward_metadata(fb)


def test_the_verify_forward_traces_whole_under_torch_compile():
    """SGLang's --enable-torch-compile traces each layer's attention: the backend's verify forward
    (the step's KV store, the op on the kernel's registered fake) is one graph, through dynamo and
    through AOT functionalization (the op mutates its outputs), with no break. Traced only: the op's
    real launch needs a GPU."""
    from torch._dynamo.backends.common import aot_autograd

    eng = Engine(QLEN_ONLY)
    be = eng.backend
    be.op = torch.ops.verify_tuner.verify_attention
    fb = eng.step([12, 30], rows=[0, 1])
    be.init_forward_metadata(fb)
    qkv, layer = eng.qkv(fb.out_cache_loc.numel()), Layer(0, H, SCALE)

    class Traced(Exception):
        pass

    def recorder(into):
        def compiler(gm, example):
            into.append(gm)
            return lambda *args: (_ for _ in ()).throw(Traced())

        return compiler

    def forward(q_nope, q_rope, k_nope, k_rope):
        return be.forward_extend(q_nope, k_nope, k_nope, layer, fb, q_rope=q_rope, k_rope=k_rope)

    dynamo, aot = [], []
    for backend in (recorder(dynamo), aot_autograd(fw_compiler=recorder(aot))):
        torch._dynamo.reset()
        with torch.no_grad(), pytest.raises(Traced):
            torch.compile(forward, backend=backend, fullgraph=True)(*qkv)
    ops = [n.target for n in dynamo[0].graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.verify_tuner.verify_attention) == 1
    assert any(str(n.target).startswith("auto_functionalized") for n in aot[0].graph.nodes)
    torch._dynamo.reset()


def test_without_the_triton_backend_prefill_is_named():
    eng = Engine(QLEN_ONLY)
    fb = ForwardBatch(ForwardMode.MIXED, 1, torch.tensor([5]), torch.tensor([0]), torch.arange(5))
    with pytest.raises(NotImplementedError, match="MIXED.*runs on SGLang's Triton backend"):
        eng.backend.init_forward_metadata(fb)


def test_one_workspace_serves_every_captured_batch_size_and_layer():
    eng = Engine(QLEN_ONLY, max_bs=64)
    be = eng.backend
    be.init_cuda_graph_state(32, 32 * Q)
    need = {bs: op.workspace_bytes(op.config_list(CFG), H=H, q_len=Q, batch=bs) for bs in range(1, 33)}
    assert be.workspace_bytes() == max(need.values()) == need[32]
    assert sorted(eng.picks) == [(Q, bs) for bs in range(1, 33)]  # each batch size's config, fixed here
    for bs in (1, 8, 32):
        fb = eng.step([20 + bs] * bs, rows=list(range(bs)))
        be.init_forward_metadata_out_graph(fb, in_capture=True)  # the capture fixes the config
        be.init_forward_metadata_out_graph(fb)  # a replay stages the step's mask
        be.init_forward_metadata_in_graph(fb)
        for layer_id in (0, 1):
            assert _verify(eng, fb, Layer(layer_id, H, SCALE)) < 1e-2
    seen = {c["workspace"].data_ptr() for c in be.op.calls}
    assert len(be.op.calls) == 6 and seen == {be._graph_ws.data_ptr()}
    assert len(eng.picks) == 32  # no config was picked again at capture
    big = eng.step([3] * 40, rows=list(range(40)))  # eager, past the captured batches
    be.init_forward_metadata(big)
    assert _verify(eng, big, Layer(0, H, SCALE)) < 1e-2
    assert be.op.calls[-1]["workspace"].numel() >= op.workspace_bytes(op.config_list(CFG), H=H, q_len=Q, batch=40)


def test_a_mask_written_after_planning_is_read_again():
    """With a plan stream SGLang plans the step's metadata before the draft stage writes the mask,
    then calls update_verify_buffers_to_fill_after_draft."""
    eng = Engine(QLEN_ONLY)
    fb = eng.step([12, 30], rows=[0, 1])
    real = fb.spec_info.custom_mask.clone()
    fb.spec_info.custom_mask.zero_()  # not written yet when the metadata is planned
    eng.backend.init_forward_metadata(fb)
    fb.spec_info.custom_mask.copy_(real)
    eng.backend.update_verify_buffers_to_fill_after_draft(fb.spec_info, None)
    assert _verify(eng, fb, Layer(0, H, SCALE)) < 1e-2


@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
def test_an_eager_step_whose_metadata_comes_after_the_mask_update(mode):
    """SGLang 0.5.23 defers an eager verify step's metadata to forward_extend (after DP padding),
    so with a plan stream update_verify_buffers_to_fill_after_draft comes first, while the backend
    still holds the previous eager step (here a larger batch): that must neither raise nor leave
    the new step's rows wrong."""
    eng = Engine(mode)
    first = eng.step([12, 30, 7, 4], rows=[0, 1, 2, 3])
    eng.backend.init_forward_metadata(first)
    assert _verify(eng, first, Layer(0, H, SCALE)) < 1e-2
    fb = eng.step([50, 3], rows=[4, 5])
    eng.backend.update_verify_buffers_to_fill_after_draft(fb.spec_info, None)
    eng.backend.init_forward_metadata(fb)
    assert _verify(eng, fb, Layer(0, H, SCALE)) < 1e-2


@pytest.mark.parametrize(
    ("change", "error", "needle"),
    [
        (lambda fb: setattr(fb.spec_info, "ragged_verify_layout", object()), NotImplementedError, "ragged verify"),
        (lambda fb: setattr(fb.spec_info, "draft_token_num", 5), ValueError, "q_len 5: this backend was built for"),
        (lambda fb: setattr(fb, "batch_size", 11), ValueError, "batch 11 outside 1..10"),
    ],
)
def test_a_step_it_cannot_run_is_named(change, error, needle):
    eng = Engine(QLEN_ONLY)
    fb = eng.step([4, 4], rows=[0, 1])
    change(fb)
    with pytest.raises(error, match=needle):
        eng.backend.init_forward_metadata(fb)


def test_an_idle_rank_s_step_has_no_metadata_to_fill():
    """Data-parallel attention: a rank without requests this step runs an IDLE batch."""
    eng = Engine(QLEN_ONLY)
    eng.backend.init_cuda_graph_state(4, 4 * Q)
    idle = ForwardBatch(ForwardMode.IDLE, 0, torch.zeros(0), torch.zeros(0), torch.zeros(0))
    for hook in (eng.backend.init_forward_metadata, eng.backend.init_forward_metadata_in_graph):
        assert hook(idle) is None
    assert eng.backend.init_forward_metadata_out_graph(idle) is None and eng.backend.op.calls == []


def test_a_graph_batch_past_the_captured_ones_and_a_forward_without_metadata_are_named():
    eng = Engine(QLEN_ONLY)
    fb = eng.step([4, 4], rows=[0, 1])
    with pytest.raises(RuntimeError, match="forward before init_forward_metadata"):
        _verify(eng, fb, Layer(0, H, SCALE))
    with pytest.raises(ValueError, match="past the captured 0"):
        eng.backend.init_forward_metadata_out_graph(fb, in_capture=True)
    eng.backend.init_forward_metadata(fb)
    q = torch.zeros(3 * Q, H, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="q holds 27 tokens, the step's metadata 2 requests x 9"):
        eng.backend.forward_extend(q, None, None, Layer(0, H, SCALE), fb)


def test_rows_dp_attention_pads_a_verify_step_with_are_left_zero():
    """With DP attention SGLang pads a step's tokens to a multiple of the attention-TP size (here 4:
    2 requests x 9 = 18 rows, 20 passed; out_cache_loc padded with slot 0), derives the batch size
    as tokens // q_len, and leaves the padded rows to the verify backend, as its Triton backend does
    (it computes none of them). They are written to the pool as given and come back zero."""
    eng = Engine(QLEN_ONLY)
    fb = eng.step([30, 5], rows=[0, 1])
    n, pad = 2 * Q, 2
    padded = ForwardBatch(fb.forward_mode, fb.batch_size, fb.seq_lens, fb.req_pool_indices,
                          torch.cat([fb.out_cache_loc, torch.zeros(pad, dtype=torch.long)]), fb.spec_info)  # fmt: skip
    eng.backend.init_forward_metadata(padded)
    q_nope, q_rope, k_nope, k_rope = eng.qkv(n + pad)
    out = eng.backend.forward_extend(q_nope, k_nope, k_nope, Layer(0, H, SCALE), padded, q_rope=q_rope, k_rope=k_rope)
    assert out.shape == (n + pad, H * 512)
    assert torch.count_nonzero(out[n:]) == 0
    want = eng.expected(fb, torch.cat([q_nope, q_rope], -1)[:n], Layer(0, H, SCALE))
    assert rel_error(out[:n].view(n, H, 512), want) < 1e-2
    q = torch.zeros(n + Q, H, 576, dtype=torch.bfloat16)  # a request's worth more: not padding, a mismatch
    with pytest.raises(ValueError, match="q holds 27 tokens, the step's metadata 2 requests x 9"):
        eng.backend.forward_extend(q, None, None, Layer(0, H, SCALE), padded)


@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
def test_an_eager_verify_step_dp_attention_pads_by_whole_requests_keeps_its_mask(mode):
    """DP attention's MAX_LEN padding (SGLang's prepare_mlp_sync_batch, eager steps) pads a rank to
    the largest rank's tokens by whole requests: batch_size = tokens // q_len, seq_lens filled with
    1, req_pool_indices and out_cache_loc with 0, and the draft's mask left as it was, covering
    the real requests only. The real requests' outputs are unchanged; the padded ones are dropped."""
    eng = Engine(mode)
    fb = eng.step([30, 5, 12], rows=[0, 1, 2])
    pad = 2  # this rank's 3 requests padded to another rank's 5
    z = {"dtype": torch.long}
    padded = ForwardBatch(fb.forward_mode, 3 + pad, torch.cat([fb.seq_lens, torch.ones(pad, **z)]),
                          torch.cat([fb.req_pool_indices, torch.zeros(pad, **z)]),
                          torch.cat([fb.out_cache_loc, torch.zeros(pad * Q, **z)]), fb.spec_info)  # fmt: skip
    eng.backend.init_forward_metadata(padded)
    n = 3 * Q
    q_nope, q_rope, k_nope, k_rope = eng.qkv(n + pad * Q)
    out = eng.backend.forward_extend(q_nope, k_nope, k_nope, Layer(0, H, SCALE), padded, q_rope=q_rope, k_rope=k_rope)
    assert out.shape == (n + pad * Q, H * 512)
    want = eng.expected(fb, torch.cat([q_nope, q_rope], -1)[:n], Layer(0, H, SCALE))
    assert rel_error(out[:n].view(n, H, 512), want) < 1e-2
    step = eng.backend.steps[Q]
    # the padded requests: chain rows, not cells read past the mask's end
    assert torch.equal(step.mask[3:5], step.packer.chain_rows[:pad])


@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
def test_without_decode_graphs_the_draft_still_writes_the_mask_in_our_layout(mode):
    """--disable-cuda-graph: SGLang never calls init_cuda_graph_state, and its draft stage writes
    each step's mask in the layout the target backend's verify_mask names -- FULL_MASK when there is
    none -- into the verify_mask's buffer when the batch fits, else into one of its own
    (eagle_worker_common). With no verify_mask the draft's full-context mask was read as q_len x
    q_len cells (attention 0.53 off). Before graph setup the backend's holds no batch and names its layout."""
    eng = Engine(mode)
    vm = eng.backend.verify_mask
    assert vm is not None and vm.mode == mode and vm.buffer.numel() == 0 and not vm.fits(1)
    drafted = vm.mode if vm is not None else FULL_MASK  # what SGLang's draft stage writes in
    eng.mode = drafted
    fb = eng.step([40, 0, 7], rows=[2, 0, 1])
    eng.backend.init_forward_metadata(fb)
    assert _verify(eng, fb, Layer(0, H, SCALE)) < 1e-2
    assert Engine(QLEN_ONLY, q_lens=(1,)).backend.verify_mask is None  # decode only: nothing verifies


def test_what_the_kernel_cannot_apply_is_refused_not_dropped():
    """SGLang passes a model's attention sinks or a sparse model's top-k indices as keywords."""
    eng = Engine(QLEN_ONLY)
    fb = eng.step([4, 4], rows=[0, 1])
    eng.backend.init_forward_metadata(fb)
    q_nope, q_rope, k_nope, k_rope = eng.qkv(2 * Q)
    layer = Layer(0, H, SCALE)
    with pytest.raises(NotImplementedError, match=r"cannot apply \['attn_sink', 'topk_indices'\]"):
        eng.backend.forward_extend(q_nope, k_nope, k_nope, layer, fb, q_rope=q_rope, k_rope=k_rope,
                                   topk_indices=torch.zeros(1), attn_sink=torch.zeros(1))  # fmt: skip
    eng.backend.forward_extend(q_nope, k_nope, k_nope, layer, fb, q_rope=q_rope, k_rope=k_rope, topk_indices=None)


def test_a_pool_of_a_dtype_the_kernel_does_not_read_is_refused_by_name():
    pool = MLAPool(size=10, layers=1, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match=r"KV pool of torch.float16"):
        VerifyMLABackend(
            pool=pool, req_to_token=torch.zeros(2, 8, dtype=torch.int32), heads=H, q_lens=(Q,), max_bs=2,
            max_context_len=8, pick_config=lambda q, bs: CFG, tree_mask_mode=TreeMaskMode.QLEN_ONLY,
        )  # fmt: skip


def _scaled_step(eng: Engine, layer: Layer) -> types.SimpleNamespace:
    """A verify step through a layer with a k_scale: the output, the draft rows as the pool stored
    them, and `want(s)`, attention over the pool's values times s (what SGLang's Triton backend reads)."""
    fb = eng.step([40, 0, 77], rows=[1, 0, 2])
    eng.backend.init_forward_metadata(fb)
    T = fb.out_cache_loc.numel()
    q_nope, q_rope, k_nope, k_rope = eng.qkv(T)
    out = eng.backend.forward_extend(q_nope, k_nope, k_nope, layer, fb, q_rope=q_rope, k_rope=k_rope)
    q = torch.cat([q_nope, q_rope], -1)

    def want(s: float) -> torch.Tensor:
        kv = eng.pool.get_key_buffer(0).float() * s
        return sglang_attention(kv=kv, req_to_token=eng.req_to_token, fb=fb, q=q, mode=QLEN_ONLY, q_len=Q, scale=SCALE)

    return types.SimpleNamespace(
        fb=fb, out=out.view(T, H, 512), stored=eng.pool.get_key_buffer(0)[fb.out_cache_loc, 0], want=want,
        k=(k_nope[:, 0], k_rope[:, 0]), args=(q_nope, k_nope, k_nope), kw={"q_rope": q_rope, "k_rope": k_rope},
    )  # fmt: skip


def test_an_e4m3_pool_with_the_layers_k_scale_as_sglang_writes_and_reads_it(monkeypatch):
    """`--kv-cache-dtype fp8_e4m3`: the layer's k / k_scale goes into the pool (its cast takes no scale; SGLang's Triton backend
    divides the same way), and the op gets the format and the scale tensor itself, so a captured
    graph follows a recalibrated k_scale."""
    eng = Engine(QLEN_ONLY, pool_dtype=torch.float8_e4m3fn)
    assert eng.backend.kv_dtype == "fp8_e4m3"
    k_scale = torch.tensor(0.5)
    step = _scaled_step(eng, Layer(0, H, SCALE, k_scale=k_scale))
    assert torch.equal(step.stored[:, :512].float(), (step.k[0] / k_scale).to(torch.float8_e4m3fn).float())
    call = eng.backend.op.calls[-1]
    assert (call["kv_dtype"], call["kv_scale"]) == ("fp8_e4m3", 0.5)
    assert rel_error(step.out, step.want(0.5)) < 1e-2


@pytest.mark.parametrize("s", [1.0, 0.5])
def test_an_fp8_checkpoints_k_scale_over_a_bf16_pool_is_read_as_sglang_writes_it(s):
    """DeepSeek-V3 and Kimi K2 ship fp8 weights: SGLang gives every attention layer a k_scale (1.0
    without calibrated KV scales) also with the default bf16 cache, and its Triton backend stores
    k / k_scale in any pool and reads back times k_scale_float. The prefix here is what such a pool
    holds (stored values, the true ones times s); the draft KV is stored the same way; attention
    sees stored x s, the bf16 kernel taking s in its softmax scale and the output after it."""
    eng = Engine(QLEN_ONLY)
    step = _scaled_step(eng, Layer(0, H, SCALE, k_scale=torch.tensor(s), k_scale_float=s))
    assert torch.equal(step.stored[:, :512], (step.k[0] / s).to(torch.bfloat16))
    assert torch.equal(step.stored[:, 512:], (step.k[1] / s).to(torch.bfloat16))
    call = eng.backend.op.calls[-1]
    assert (call["kv_dtype"], call["kv_scale"], call["scale"]) == ("bf16", 1.0, SCALE * s)
    assert rel_error(step.out, step.want(s)) < 1e-2
    assert s == 1.0 or rel_error(step.out, step.want(1.0)) > 0.1  # the scale is not dropped
    with pytest.raises(NotImplementedError, match="has a k_scale but no k_scale_float"):
        eng.backend.forward_extend(*step.args, Layer(0, H, SCALE, k_scale=torch.tensor(s)), step.fb, **step.kw)
