"""Graphs per (batch size, prefix range) in the SGLang backend, on the CPU with the doubles, driven
as SGLang 0.5.23's decode graph runner drives attention variants (test_sglang_contract.py checks
that source): every label captured for every batch size with its label set, then per step the
label chosen by `select` on the host, the replay's metadata, and the graph of that label. A batch
whose longest prefix crosses the breakpoint replays the other range's graph, with its config; the
output is attention computed from SGLang's tensors either way."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.engine import op
from verify_tuner.engine.sglang_backend import VerifyMLABackend
from verify_tuner.engine.tree_masks import TreeMaskMode
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.reference import rel_error

from tests.engine.sglang_doubles import ForwardBatch, ForwardMode, Layer, MLAPool, ReferenceOp, SpecInfo
from tests.engine.sglang_trees import QLEN_ONLY
from tests.engine.test_sglang_backend import CTX, POOL, SCALE, Engine, H, Q, _verify

SHORT = KernelConfig(nsplit=24, ht=8, tk=32, block=256, qt=2)  # small blocks: short prefixes
LONG = KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3)  # the default


def ranges(q: int, bs: int) -> tuple[tuple[int, KernelConfig], ...]:
    """B=1 splits at 100 tokens, B=4 at 60, B=3 has one range (its bucket, 3..4, shares B=4's graph)."""
    return {1: ((0, SHORT), (100, LONG)), 4: ((0, SHORT), (60, LONG))}.get(bs, ((0, LONG),))


class Runner:
    """SGLang's DecodeCudaGraphRunner as it drives a backend's attention variants: the variants taken
    before init_cuda_graph_state, every (batch size, label) captured with the label set, and per
    replay the label `select` gives, the metadata on the padded batch's view, then that graph."""

    def __init__(self, eng: Engine, capture_bs: tuple[int, ...], *, variants: bool = True) -> None:
        self.eng, self.be, self.capture_bs = eng, eng.backend, capture_bs
        self.variants = self.be.graph_variants() if variants else None
        self.be.init_cuda_graph_state(max(capture_bs), max(capture_bs) * Q)
        self.graphs: dict[tuple[int, str | None], list[int]] = {}
        z = {"dtype": torch.int64}
        self.static = ForwardBatch(ForwardMode.TARGET_VERIFY, 4, torch.ones(4, **z), torch.zeros(4, **z),
                                   torch.zeros(4 * Q, **z), SpecInfo(torch.ones(4096, dtype=torch.bool), Q, 4),
                                   torch.ones(4, **z))  # fmt: skip
        labels = self.variants.capture_labels if self.variants else (None,)
        for bs in reversed(capture_bs):
            for lab in labels:
                eng.label = lab  # _set_capture_attention_variant
                self.be.init_forward_metadata_out_graph(self._view(bs), in_capture=True)
                self.graphs[(bs, lab)] = self.be._current[2]  # the config the graph records
        eng.label = None

    def _view(self, bs: int) -> ForwardBatch:
        s = self.static
        return ForwardBatch(ForwardMode.TARGET_VERIFY, bs, s.seq_lens[:bs], s.req_pool_indices[:bs],
                            s.out_cache_loc[: bs * Q], s.spec_info, s.seq_lens_cpu[:bs])  # fmt: skip

    def replay(
        self,
        step: ForwardBatch,
        *,
        host_lengths: bool = True,
        dp_counts: tuple[int, ...] | None = None,
        host_ahead: int = 0,
    ) -> tuple[str | None, list[int], float]:
        """The step through its graph: (its label, the graph's config, the output's relative error).
        `dp_counts`: every DP rank's requests, this one's among them (the runner's MLP gather pads this
        rank to the largest's graph). `host_ahead`: what the host copy of the lengths adds to the
        device's (DFlash's and DSpark's verify: the draft block)."""
        raw = step.batch_size
        if dp_counts is not None:
            step.original_global_num_tokens_cpu = list(dp_counts)
        bs = min(b for b in self.capture_bs if b >= max(dp_counts or (raw,)))
        if host_lengths:
            step.seq_lens_cpu = step.seq_lens + host_ahead
        lab = self.variants.select(step) if self.variants else None
        s = self.static
        s.seq_lens.fill_(1), s.seq_lens_cpu.fill_(1)  # padding rows: SGLang's fill value, zero rows and slots
        s.req_pool_indices.zero_(), s.out_cache_loc.zero_()
        s.seq_lens[:raw].copy_(step.seq_lens)
        s.seq_lens_cpu[:raw].copy_(step.seq_lens + host_ahead)
        s.req_pool_indices[:raw].copy_(step.req_pool_indices)
        s.out_cache_loc[: raw * Q].copy_(step.out_cache_loc)
        view = self._view(bs)
        if not host_lengths:
            view.seq_lens_cpu = None
        view.spec_info = step.spec_info
        self.be.init_forward_metadata_out_graph(view)
        assert self.be._current[2] == self.graphs[(bs, lab)]  # the replay's metadata is the graph's
        self.be.init_forward_metadata_in_graph(view)
        if raw == bs:
            return lab, self.graphs[(bs, lab)], _verify(self.eng, step, Layer(0, H, SCALE))
        # a padded replay: the graph's forward runs bs requests; the real ones' rows are checked
        layer, n = Layer(0, H, SCALE), raw * Q
        q_nope, q_rope, k_nope, k_rope = self.eng.qkv(bs * Q)
        out = self.be.forward_extend(q_nope, k_nope, k_nope, layer, view, q_rope=q_rope, k_rope=k_rope)
        want = self.eng.expected(step, torch.cat([q_nope, q_rope], -1)[:n], layer)
        return lab, self.graphs[(bs, lab)], rel_error(out[:n].view(n, H, 512), want)


def _engine(*, dp_graph_batch: bool = False, host_counts_draft: bool = False) -> Engine:
    eng = Engine(QLEN_ONLY, max_bs=6)
    eng.label = None
    eng.backend = VerifyMLABackend(
        pool=eng.pool, req_to_token=eng.req_to_token, heads=H, q_lens=(Q,), max_bs=8, max_context_len=CTX,
        pick_ranges=ranges, capture_label=lambda: eng.label, tree_mask_mode=TreeMaskMode(QLEN_ONLY),
        dp_graph_batch=dp_graph_batch, host_counts_draft=host_counts_draft,
    )  # fmt: skip
    eng.backend.op = ReferenceOp()
    return eng


def test_each_batch_size_captures_a_graph_per_range_in_one_workspace():
    eng = _engine()
    run = Runner(eng, (1, 2, 4))
    assert run.variants.capture_labels == ("prefix_range_0", "prefix_range_1")
    assert eng.backend.needs_cpu_seq_lens  # a range is chosen from the batch's host lengths
    got = {k: v for k, v in run.graphs.items()}
    assert got[(1, "prefix_range_0")] == got[(4, "prefix_range_0")] == op.config_list(SHORT)
    assert got[(1, "prefix_range_1")] == got[(4, "prefix_range_1")] == op.config_list(LONG)
    assert got[(2, "prefix_range_0")] == got[(2, "prefix_range_1")] == op.config_list(LONG)  # one range: repeated
    need = max(op.workspace_bytes(op.config_list(c), H=H, q_len=Q, batch=bs) for c in (SHORT, LONG) for bs in (1, 4))
    assert eng.backend.workspace_bytes() == need  # one buffer, sized for the largest (batch, range) config


def test_a_batch_crossing_the_breakpoint_replays_the_other_range_s_graph():
    eng = _engine()
    run = Runner(eng, (1, 2, 4))
    seen = []
    for n in (0, 40, 99, 100, 101, 180):  # one request's prefix growing past B=1's breakpoint at 100
        lab, cfg, err = run.replay(eng.step([n], rows=[3]))
        assert err < 1e-2, n
        seen.append((lab, cfg))
    assert seen == [("prefix_range_0", op.config_list(SHORT))] * 3 + [("prefix_range_1", op.config_list(LONG))] * 3
    assert eng.backend.op.calls[-1]["config"] == op.config_list(LONG) and eng.backend.graphs.length_syncs == 0
    # B=4 splits at 60: its longest request decides
    assert run.replay(eng.step([10, 59, 3, 0], rows=[0, 1, 2, 4]))[:2] == ("prefix_range_0", op.config_list(SHORT))
    lab, cfg, err = run.replay(eng.step([10, 61, 3, 0], rows=[0, 1, 2, 4]))
    assert (lab, cfg) == ("prefix_range_1", op.config_list(LONG)) and err < 1e-2


def test_a_padded_batch_takes_the_ranges_of_the_graph_it_is_padded_into():
    """B=3 replays B=4's graphs (SGLang pads it): B=4's breakpoint, not B=3's single range, decides,
    and the padded graph's forward leaves the real requests' attention right."""
    eng = _engine()
    run = Runner(eng, (1, 2, 4))
    for n, want in ((70, ("prefix_range_1", op.config_list(LONG))), (50, ("prefix_range_0", op.config_list(SHORT)))):
        lab, cfg, err = run.replay(eng.step([n, 5, 5], rows=[0, 1, 2]))
        assert (lab, cfg) == want and err < 1e-2, n


def test_a_dp_rank_takes_the_ranges_of_the_largest_rank_s_graph():
    """Under DP attention's MLP gather SGLang replays every rank in the graph of the largest rank's
    batch: one request beside a rank of three replays B=4's graphs, so B=4's breakpoint (60) decides,
    not B=1's (100); the label and the replay's metadata agree and the attention is right."""
    eng = _engine(dp_graph_batch=True)
    run = Runner(eng, (1, 2, 4))
    for n, want in ((70, ("prefix_range_1", op.config_list(LONG))), (50, ("prefix_range_0", op.config_list(SHORT)))):
        lab, cfg, err = run.replay(eng.step([n], rows=[3]), dp_counts=(1, 3))
        assert (lab, cfg) == want and err < 1e-2, n
    assert run.replay(eng.step([70], rows=[3]), dp_counts=(1, 1))[:2] == ("prefix_range_0", op.config_list(SHORT))
    with pytest.raises(RuntimeError, match="original_global_num_tokens_cpu"):
        run.variants.select(eng.step([70], rows=[3]))  # SGLang's own replay refuses such a step too


def test_a_dflash_verify_s_host_lengths_count_its_draft_block():
    """DFlash and DSpark hand verify's host lengths with the draft block added (the device's without):
    the range is chosen by the prefix, in the graph's select and in an eager step alike."""
    eng = _engine(host_counts_draft=True)
    run = Runner(eng, (1, 2, 4))
    for n, want in ((95, ("prefix_range_0", op.config_list(SHORT))), (100, ("prefix_range_1", op.config_list(LONG)))):
        lab, cfg, err = run.replay(eng.step([n], rows=[3], chain=True), host_ahead=Q)
        assert (lab, cfg) == want and err < 1e-2, n
    step = eng.step([95], rows=[3], chain=True)
    step.seq_lens_cpu = step.seq_lens + Q
    eng.backend.init_forward_metadata(step)
    assert eng.backend._current[2] == op.config_list(SHORT) and eng.backend.graphs.length_syncs == 0
    # SGLang's verify warm-up fills the host lengths with 1, no block added: the first range, not -1
    warm = eng.step([1], rows=[3], chain=True)
    warm.seq_lens_cpu = warm.seq_lens.clone()
    assert eng.backend.graphs.range_of(warm, Q, 1) == 0 and run.variants.select(warm) == "prefix_range_0"


def test_without_host_lengths_the_range_is_read_from_the_device_and_counted():
    eng = _engine()
    run = Runner(eng, (1, 2, 4))
    lab, _, err = run.replay(eng.step([150], rows=[1]), host_lengths=False)
    assert lab == "prefix_range_1" and err < 1e-2 and eng.backend.graphs.length_syncs == 2  # select + metadata


def test_without_sglang_s_variants_each_batch_size_has_one_graph_the_longest_prefixes():
    """A runner that did not take the variants (another graph runner, the hook not applied) captures one
    graph per batch size: the last range's config, replayed whatever the prefix."""
    eng = _engine()
    run = Runner(eng, (1, 2, 4), variants=False)
    assert set(run.graphs) == {(1, None), (2, None), (4, None)}
    lab, cfg, err = run.replay(eng.step([5], rows=[0]))
    assert (lab, cfg) == (None, op.config_list(LONG)) and err < 1e-2
    eng.label = "prefix_range_0"  # SGLang sets a label only for variants it took; a label still names its range
    eng.backend.init_forward_metadata_out_graph(run._view(1), in_capture=True)
    assert eng.backend._current[2] == op.config_list(SHORT)


def test_eager_batches_past_the_captured_ones_take_their_range_too():
    eng = _engine()
    Runner(eng, (1, 2))
    be = eng.backend
    for n, want in ((20, SHORT), (75, LONG)):
        fb = eng.step([n, 3, 3, 3], rows=[0, 1, 2, 4])
        fb.seq_lens_cpu = fb.seq_lens.clone()
        be.init_forward_metadata(fb)  # B=4 is past the captured 2: eager
        assert _verify(eng, fb, Layer(1, H, SCALE)) < 1e-2 and be.op.calls[-1]["config"] == op.config_list(want)


def test_a_decode_step_takes_the_range_of_its_prefix_not_of_its_length():
    """SGLang's decode lengths count the step's own token (seq_len 100 is 99 tokens before it), so the
    range, like the prefix the kernel reads, comes from seq_len - 1: B=1's breakpoint is at 100."""
    eng = Engine(QLEN_ONLY, max_bs=6, q_lens=(1,))
    be = eng.backend = VerifyMLABackend(
        pool=eng.pool, req_to_token=eng.req_to_token, heads=H, q_lens=(1,), max_bs=8, max_context_len=CTX,
        pick_ranges=ranges, tree_mask_mode=TreeMaskMode(QLEN_ONLY),
    )  # fmt: skip
    be.op = ReferenceOp()
    layer = Layer(1, H, SCALE)
    for n, want in ((99, SHORT), (100, LONG)):
        fb = eng.decode([n], [3])
        fb.seq_lens_cpu = fb.seq_lens.clone()
        be.init_forward_metadata(fb)
        q_nope, q_rope, k_nope, k_rope = eng.qkv(1)
        out = be.forward_decode(q_nope, k_nope, k_nope, layer, fb, q_rope=q_rope, k_rope=k_rope)
        assert be.op.calls[-1]["config"] == op.config_list(want), n
        assert rel_error(out.view(1, H, 512), eng.expected(fb, torch.cat([q_nope, q_rope], -1), layer)) < 1e-2


def test_one_config_per_batch_size_takes_no_variants_and_no_host_lengths():
    eng = Engine(QLEN_ONLY)
    assert eng.backend.graph_variants() is None and not eng.backend.needs_cpu_seq_lens


@pytest.mark.parametrize(
    ("pick", "error", "needle"),
    [
        (lambda q, bs: ((10, LONG),), ValueError, r"must start at 0 and increase, got \(10,\)"),
        (lambda q, bs: ((0, SHORT), (50, LONG), (50, SHORT)), ValueError, "must start at 0 and increase"),
    ],
)
def test_ranges_that_do_not_tile_the_prefixes_are_named(pick, error, needle):
    be = VerifyMLABackend(pool=MLAPool(size=POOL, layers=1), req_to_token=torch.zeros(4, CTX, dtype=torch.int32),
                          heads=H, q_lens=(Q,), max_bs=4, max_context_len=CTX, pick_ranges=pick)  # fmt: skip
    with pytest.raises(error, match=needle):
        be.init_cuda_graph_state(2, 2 * Q)


def test_a_label_that_is_not_a_range_and_two_pickers_are_named():
    eng = _engine()
    Runner(eng, (1,))
    eng.label = "dense"
    with pytest.raises(ValueError, match="attention variant 'dense' is not a prefix range of this backend"):
        eng.backend.init_forward_metadata_out_graph(eng.step([3], rows=[0]), in_capture=True)
    with pytest.raises(TypeError, match="give pick_config"):
        VerifyMLABackend(pool=eng.pool, req_to_token=eng.req_to_token, heads=H, q_lens=(Q,), max_bs=4,
                         max_context_len=CTX, pick_config=lambda q, bs: LONG, pick_ranges=ranges)  # fmt: skip
