"""SGLang's verify masks, in each layout its tree kernel writes, turned into the kernel's rows on
the device's side of the engine (tuner/engine/tree_masks.py), checked on the CPU against the trees
they were drawn from: EAGLE trees (topk > 1), chains, DFlash's None, up to 64 nodes."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.engine.tree_masks import MaskPacker, TreeMaskMode, mask_numel, packed_dtype

from tests.engine.sglang_trees import FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING, chain, eagle_tree, sglang_mask


def _as_int64(rows: list[int]) -> list[int]:
    return [r - (1 << 64) if r >= 1 << 63 else r for r in rows]


def _pack(mask, mode, seq_lens, q_len, max_bs=8):
    packer = MaskPacker(q_len=q_len, max_bs=max_bs, device="cpu")
    out = torch.full((max_bs, q_len), -7, dtype=torch.int64)
    packer.pack(mask, TreeMaskMode(mode), bs=len(seq_lens), out=out, seq_lens=torch.tensor(seq_lens))
    return out


def test_the_modes_are_sglang_s_values():
    assert (TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY, TreeMaskMode.QLEN_ONLY_BITPACKING) == (0, 1, 2)
    assert [packed_dtype(q) for q in (1, 8, 9, 16, 17, 32)] == [torch.uint8] * 2 + [torch.uint16] * 2 + [
        torch.uint32
    ] * 2
    with pytest.raises(ValueError, match="at most 32 draft tokens"):
        packed_dtype(33)
    assert mask_numel(TreeMaskMode.FULL_MASK, bs=2, q_len=3, max_context_len=10) == 2 * 3 * 13


@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING])
@pytest.mark.parametrize(("topk", "depth", "q_len"), [(4, 4, 9), (8, 6, 16), (2, 8, 12), (4, 5, 32), (1, 8, 9)])
def test_eagle_trees_in_each_layout_become_their_ancestor_rows(mode, topk, depth, q_len):
    rng = random.Random(topk * 100 + q_len)
    trees = [eagle_tree(topk=topk, depth=depth, q_len=q_len, rng=rng) for _ in range(5)]
    seq_lens = [0, 37, 1, 250, 4]  # a request joining at P=0 among longer ones
    mask = sglang_mask(trees, seq_lens, topk=topk, q_len=q_len, mode=mode)
    out = _pack(mask, mode, seq_lens, q_len)
    assert out[:5].tolist() == [_as_int64(t.rows) for t in trees]
    assert (out[5:] == -7).all()  # rows past the batch are left alone


@pytest.mark.parametrize("q_len", [33, 64])
@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY])
def test_trees_past_32_nodes_need_a_bool_layout_and_fill_uint64_rows(mode, q_len):
    rng = random.Random(q_len)
    trees = [eagle_tree(topk=8, depth=10, q_len=q_len, rng=rng) for _ in range(3)]
    seq_lens = [5, 0, 70]
    out = _pack(sglang_mask(trees, seq_lens, topk=8, q_len=q_len, mode=mode), mode, seq_lens, q_len)
    assert out[:3].tolist() == [_as_int64(t.rows) for t in trees]
    assert any(r < 0 for t in out[:3].tolist() for r in t) == (q_len == 64)  # bit 63 is int64's sign


def test_a_uint8_full_mask_reads_like_a_bool_one():
    """The Triton backend's preallocated FULL_MASK buffer holds uint8 cells."""
    trees = [eagle_tree(topk=4, depth=4, q_len=9, rng=random.Random(3)) for _ in range(2)]
    mask = sglang_mask(trees, [12, 3], topk=4, q_len=9, mode=FULL_MASK)
    assert torch.equal(_pack(mask.to(torch.uint8), FULL_MASK, [12, 3], 9), _pack(mask, FULL_MASK, [12, 3], 9))


def test_a_preallocated_buffer_longer_than_the_batch_is_read_at_the_batch():
    trees = [eagle_tree(topk=4, depth=4, q_len=9, rng=random.Random(4)) for _ in range(3)]
    for mode in (QLEN_ONLY, QLEN_ONLY_BITPACKING):
        mask = sglang_mask(trees, [1, 2, 3], topk=4, q_len=9, mode=mode)
        padded = torch.cat([mask, torch.zeros(500, dtype=mask.dtype)])
        assert torch.equal(_pack(padded, mode, [1, 2, 3], 9), _pack(mask, mode, [1, 2, 3], 9))


@pytest.mark.parametrize("q_len", [1, 9, 64])
def test_no_mask_is_a_chain(q_len):
    """DFlash verifies a linear block with custom_mask None: node i sees nodes 0..i."""
    out = _pack(None, FULL_MASK, [5, 9], q_len)
    assert out[:2].tolist() == [_as_int64(chain(q_len).rows)] * 2


def test_a_full_mask_needs_the_prefix_lengths():
    packer = MaskPacker(q_len=9, max_bs=2, device="cpu")
    with pytest.raises(ValueError, match="pass seq_lens"):
        packer.pack(
            torch.ones(200, dtype=torch.bool), TreeMaskMode.FULL_MASK, bs=2, out=torch.zeros(2, 9, dtype=torch.int64)
        )
