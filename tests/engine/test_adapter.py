"""The SGLang-style backend's buffers on the CPU: what a step's metadata refill writes, that it
writes in place (a captured graph keeps reading the same memory), and the mistakes it names.
tests/engine/test_adapter_gpu.py runs the graph itself against the reference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.engine.adapter import VerifyBackend, mask_dtype_for
from verify_tuner.kernels.config import KernelConfig

CFG = KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3)
Q = 9


def _backend(**kw):
    kv = torch.zeros(1000, 576, dtype=torch.bfloat16)
    mode = kw.pop("mode", {"req_to_token": torch.zeros(16, 4096, dtype=torch.int32)})
    return VerifyBackend(
        H=8, q_len=Q, kv_pool=kv, pick_config=lambda bs: CFG, max_batch=8, softmax_scale=0.04, **mode, **kw
    )


def _step(bs, base=0):
    return {
        "seq_lens": torch.tensor([100 + base, 0, 7, 4000][:bs], dtype=torch.int64),
        "out_cache_loc": torch.arange(bs * Q, dtype=torch.int64) + 500 + base,
        "tree_mask": torch.randint(0, 1 << 9, (bs, Q), dtype=torch.int32).to(torch.uint16),
        "req_pool_indices": torch.tensor([5, 3, 11, 0][:bs], dtype=torch.int64),
    }


def test_sglang_packs_masks_as_it_does():
    assert [mask_dtype_for(q) for q in (1, 8, 9, 16, 17, 32, 33, 64)] == [
        torch.uint8, torch.uint8, torch.uint16, torch.uint16, torch.uint32, torch.uint32, torch.int64, torch.int64,
    ]  # fmt: skip


def test_a_refill_writes_the_batch_in_place():
    be = _backend()
    ptrs = [t.data_ptr() for t in (be.buf.kv_indptr, be.buf.rows, be.buf.draft, be.buf.mask)]
    for base in (0, 9, 18):  # three steps: prefixes grow, a captured graph reads the same buffers
        step = _step(4, base)
        be.init_forward_metadata(4, **step)
        assert be.buf.kv_indptr[:5].tolist() == [0, 100 + base, 100 + base, 107 + base, 4107 + base]
        assert be.buf.rows[:4].tolist() == [5, 3, 11, 0]
        assert be.buf.draft[:4].flatten().tolist() == step["out_cache_loc"].tolist()
        assert torch.equal(be.buf.mask[:4], step["tree_mask"])
    assert ptrs == [t.data_ptr() for t in (be.buf.kv_indptr, be.buf.rows, be.buf.draft, be.buf.mask)]
    assert be.buf.kv_indptr.dtype == torch.int32 and be.buf.draft.dtype == torch.int32


def test_a_smaller_batch_uses_the_front_of_the_buffers():
    be = _backend()
    be.init_forward_metadata(4, **_step(4))
    be.init_forward_metadata(2, **_step(2, 50))
    assert be.buf.kv_indptr[:3].tolist() == [0, 150, 150] and be.buf.rows[:2].tolist() == [5, 3]


def test_signed_mask_rows_of_the_same_width_are_the_same_bits():
    be = _backend()
    step = _step(2)
    signed = step["tree_mask"].view(torch.int16)
    be.init_forward_metadata(2, **{**step, "tree_mask": signed})
    assert torch.equal(be.buf.mask[:2], step["tree_mask"])


def test_block_table_mode_copies_the_table_rows():
    be = _backend(mode={"max_pages": 6})
    table = torch.arange(2 * 4, dtype=torch.int32).view(2, 4) + 70
    step = {k: v for k, v in _step(2).items() if k != "req_pool_indices"}
    be.init_forward_metadata(2, **step, block_table=table)
    assert be.buf.table[:2, :4].tolist() == table.tolist() and be.buf.rows is None


@pytest.mark.parametrize(
    ("kw", "call", "needle"),
    [
        ({"mode": {}}, None, "give req_to_token (page size 1) or max_pages"),
        (
            {"mode": {"req_to_token": torch.zeros(2, 2, dtype=torch.int32), "max_pages": 4}},
            None,
            "not both",
        ),
        ({}, {"bs": 9}, "batch 9 outside 1..8"),
        ({}, {"drop": "req_pool_indices"}, "pass req_pool_indices"),
        ({"mode": {"max_pages": 2}}, {"drop": "req_pool_indices", "table": 3}, "holds 2"),
        ({"mode": {"max_pages": 2}}, {"drop": "req_pool_indices"}, "pass block_table"),
        ({}, {"mask": torch.int64}, "this backend holds torch.uint16 rows"),
    ],
)
def test_mistakes_are_named(kw, call, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        be = _backend(**kw)
        bs = (call or {}).get("bs", 2)
        step = _step(min(bs, 4))
        if call and "drop" in call:
            step.pop(call["drop"])
        if call and "table" in call:
            step["block_table"] = torch.zeros(2, call["table"], dtype=torch.int32)
        if call and "mask" in call:
            step["tree_mask"] = step["tree_mask"].to(call["mask"])
        be.init_forward_metadata(bs, **step)


def test_layers_share_one_refill():
    be = _backend()
    layer = be.for_layer(torch.ones(1000, 576, dtype=torch.bfloat16))
    be.init_forward_metadata(4, **_step(4))
    assert layer.buf is be.buf and layer.kv is not be.kv and layer.config_for(4) is be.config_for(4)
    with pytest.raises(ValueError, match="not laid out like"):
        be.for_layer(torch.ones(10, 64, 576, dtype=torch.bfloat16))


@pytest.mark.parametrize("q_len", [0, 65])
def test_a_q_len_no_tree_mask_row_holds_is_named(q_len):
    with pytest.raises(ValueError, match=f"q_len must be in 1..64 .*got {q_len}"):
        VerifyBackend(
            H=8,
            q_len=q_len,
            kv_pool=torch.zeros(10, 576, dtype=torch.bfloat16),
            pick_config=lambda bs: CFG,
            max_batch=2,
            softmax_scale=0.04,
            req_to_token=torch.zeros(2, 8, dtype=torch.int32),
        )


@pytest.mark.parametrize("q_len", [0, -3, 65])
def test_the_mask_row_type_of_a_q_len_no_row_holds_is_named(q_len):
    """integration.md passes mask_dtype_for(num_draft_nodes) before the backend checks q_len: 65 was
    a bare StopIteration there, 0 and -3 quietly uint8."""
    with pytest.raises(ValueError, match=f"q_len must be in 1..64 .*got {q_len}"):
        mask_dtype_for(q_len)


@pytest.mark.parametrize("short", ["seq_lens", "req_pool_indices", "block_table"])
def test_per_request_rows_shorter_than_the_batch_are_named(short):
    """A batch of 3 padded to the bs=4 graph with seq_lens for the 3 only: torch resized the cumsum's
    output (kv_indptr[4] kept the last step's value: a negative prefix) and broadcast one pool row."""
    be = _backend(mode={"max_pages": 4}) if short == "block_table" else _backend()
    step = _step(4)
    if short == "block_table":
        step.pop("req_pool_indices")
        step["block_table"] = torch.zeros(3, 4, dtype=torch.int32)
    else:
        step[short] = step[short][:3] if short == "seq_lens" else step[short][:1]
    before = be.buf.kv_indptr.clone()
    with pytest.raises(ValueError, match=f"{short} must hold a row for each of the 4 requests"):
        be.init_forward_metadata(4, **step)
    assert torch.equal(be.buf.kv_indptr, before)  # refused before anything was written
