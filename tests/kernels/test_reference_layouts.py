"""The reference on the engine layouts (CPU torch): a paged pool, q split into q_nope + q_pe, and
packed mask rows define the same attention as the dense form of the same data. The GPU tests then
hold the kernel to this reference on each layout."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.kernels.reference import Inputs, make_inputs, reference, widen_mask

LENS, Q, H = [70, 0, 129, 5], 9, 4


def _dense(inp: Inputs) -> Inputs:
    """The same data as one [S, 576] pool, page-size-1 slots, a 576-wide q and int64 masks."""
    ps = inp.page_size
    slots = []
    for b in range(inp.batch):
        lo, hi = int(inp.prefix_indptr[b]), int(inp.prefix_indptr[b + 1])
        v = torch.arange(hi - lo)
        if inp.prefix_indices.dim() == 2:
            row = int(inp.prefix_rows[b]) if inp.prefix_rows is not None else b
            slots.append(inp.prefix_indices[row, v // ps].long() * ps + v % ps)
        else:
            slots.append(inp.prefix_indices[lo:hi])
    return Inputs(
        q=inp.full_q().contiguous(),
        kv=inp.kv.reshape(-1, 576),
        prefix_indices=torch.cat(slots).to(torch.int32),
        prefix_indptr=inp.prefix_indptr,
        draft_indices=inp.draft_indices,
        tree_mask=widen_mask(inp.tree_mask),
        scale=inp.scale,
    )


@pytest.mark.parametrize("page_size", [2, 16, 64])
@pytest.mark.parametrize("layout", ["scattered", "contiguous"])
def test_a_paged_pool_is_the_same_attention_as_its_slots(page_size, layout):
    inp = make_inputs(prefix_lens=LENS, q_len=Q, H=H, device="cpu", page_size=page_size, layout=layout, seed=3)
    assert inp.kv.shape[1:] == (page_size, 576) and inp.prefix_indices.shape[0] == len(LENS)
    lay = inp.layout()
    assert (1 << lay.page_shift, lay.page_stride) == (page_size, inp.prefix_indices.shape[1])
    dense = _dense(inp)
    assert dense.layout().page_shift == 0
    # every slot a request reads (prefix and drafts) is distinct: the pages do not overlap
    used = torch.cat([dense.prefix_indices.long(), dense.draft_indices.flatten().long()])
    assert used.unique().numel() == used.numel()
    for got, want in zip(reference(inp), reference(dense)):
        assert torch.equal(got, want)


def test_req_to_token_rows_are_the_same_attention_as_their_slots():
    inp = make_inputs(prefix_lens=LENS, q_len=Q, H=H, device="cpu", req_to_token=True, seed=7)
    assert inp.prefix_indices.shape == (len(LENS) + 5, max(LENS) + 7) and inp.prefix_rows.shape == (len(LENS),)
    assert inp.prefix_rows.unique().numel() == len(LENS) and sorted(inp.prefix_rows.tolist()) != list(range(len(LENS)))
    lay = inp.layout()
    assert (lay.page_shift, lay.page_stride) == (0, max(LENS) + 7)
    dense = _dense(inp)
    assert torch.equal(
        dense.prefix_indices, make_inputs(prefix_lens=LENS, q_len=Q, H=H, device="cpu", seed=7).prefix_indices
    )
    for got, want in zip(reference(inp), reference(dense)):
        assert torch.equal(got, want)


def test_q_nope_and_q_pe_views_are_the_same_attention_as_one_q():
    inp = make_inputs(prefix_lens=LENS, q_len=Q, H=H, device="cpu", split_q=True, seed=4)
    assert inp.q.shape[-1] == 512 and not inp.q.is_contiguous() and inp.q_pe.shape[-1] == 64
    lay = inp.layout()
    assert (lay.q_st, lay.q_sh, lay.pe_st, lay.pe_sh) == (H * 640, 640, H * 64, 64)
    for got, want in zip(reference(inp), reference(_dense(inp))):
        assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("dtype", "width", "q_len"), [("uint8", 1, 8), ("int16", 2, 16), ("uint16", 2, 9), ("uint32", 4, 32)]
)
def test_packed_mask_rows_hold_the_same_tree(dtype, width, q_len):
    wide = make_inputs(prefix_lens=LENS, q_len=q_len, H=H, device="cpu", seed=5)
    packed = make_inputs(prefix_lens=LENS, q_len=q_len, H=H, device="cpu", seed=5, mask_dtype=dtype)
    assert str(packed.tree_mask.dtype) == f"torch.{dtype}" and packed.layout().mask_bytes == width
    assert torch.equal(widen_mask(packed.tree_mask), wide.tree_mask)
    for got, want in zip(reference(packed), reference(wide)):
        assert torch.equal(got, want)


def test_a_64_node_tree_keeps_its_top_bit():
    inp = make_inputs(prefix_lens=[3], q_len=64, H=1, device="cpu", seed=6)
    assert int(inp.tree_mask[0, 63]) < 0  # bit 63 set: the int64 pattern of a uint64 row
    assert int(widen_mask(inp.tree_mask)[0, 63]) == int(inp.tree_mask[0, 63])
    with pytest.raises(ValueError, match="does not fit uint32"):
        make_inputs(prefix_lens=[3], q_len=64, H=1, device="cpu", mask_dtype="uint32")


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3", "fp8_e4m3_qk"])
def test_score_inputs_make_each_rows_lse_its_own_score(kv_dtype):
    """What the scores' GPU test and bench/fp8_qk_probe.py --scores compare the kernel's lse with:
    on score_inputs every node sees only itself, so the reference's lse is own_scores on q as the
    format computes with it."""
    from verify_tuner.kernels.reference import own_scores, quantized_q, reference, score_inputs

    inp = score_inputs(batch=3, q_len=5, H=2, seed=11, kv_dtype=kv_dtype, scale=0.1447, device="cpu")
    assert int(inp.prefix_indptr[-1]) == 0
    _, lse = reference(inp)
    want = own_scores(inp, quantized_q(inp.full_q(), kv_dtype))
    torch.testing.assert_close(lse, want, rtol=1e-5, atol=1e-5)
    # the check can fail: another node's key in place of a node's own moves the scores
    swapped = dataclasses.replace(inp, draft_indices=inp.draft_indices.flip(-1))
    assert not torch.allclose(own_scores(swapped, quantized_q(inp.full_q(), kv_dtype)), lse, atol=1e-3)
