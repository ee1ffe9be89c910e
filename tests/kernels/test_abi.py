"""The op's checks of its tensors (kernels/abi.py: torch-free, so they run here) and the launch
arithmetic both loaders share."""

from __future__ import annotations

import pytest
from verify_tuner.kernels.abi import (
    PARTIAL_ARGS,
    REDUCE_ARGS,
    LaunchSpec,
    Layout,
    TensorMeta,
    call_layout,
    check_call,
    reduce_grid,
)
from verify_tuner.kernels.build import SOURCE
from verify_tuner.kernels.config import KernelConfig

B, Q, H = 4, 9, 8


def _good(**over):
    d = "cuda:1"
    t = {
        "q": TensorMeta("bfloat16", (B, Q, H, 576), d, True),
        "kv": TensorMeta("bfloat16", (5000, 576), d, True),
        "kv_indptr": TensorMeta("int32", (B + 1,), d, True),
        "kv_indices": TensorMeta("int32", (4000,), d, True),
        "draft_slots": TensorMeta("int32", (B, Q), d, True),
        "tree_mask": TensorMeta("int64", (B, Q), d, True),
        "out": TensorMeta("bfloat16", (B, Q, H, 512), d, True),
        "lse": TensorMeta("float32", (B, Q, H), d, True),
    }
    t.update(over)
    return t


def test_a_well_formed_call_passes_on_any_cuda_device():
    assert check_call(_good(), q_len=Q, H=H) is None
    assert check_call(_good(lse=None), q_len=Q, H=H) is None


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"q": TensorMeta("float16", (B, Q, H, 576), "cuda:1", True)}, "q must be bfloat16"),
        ({"kv_indptr": TensorMeta("int64", (B + 1,), "cuda:1", True)}, "kv_indptr must be int32"),
        ({"tree_mask": TensorMeta("uint8", (B, Q), "cuda:1", True)}, "tree_mask's uint8 rows hold 8 bits, q_len is 9"),
        ({"tree_mask": TensorMeta("float32", (B, Q), "cuda:1", True)}, "tree_mask must be an integer type"),
        ({"out": TensorMeta("bfloat16", (B, Q, H, 576), "cuda:1", True)}, "out must be [4, 9, 8, 512]"),
        ({"kv_indptr": TensorMeta("int32", (B,), "cuda:1", True)}, "kv_indptr must be [5]"),
        ({"kv": TensorMeta("bfloat16", (5000, 512), "cuda:1", True)}, "kv must be [*, 576]"),
        ({"kv": TensorMeta("bfloat16", (100, 48, 576), "cuda:1", True)}, "page size must be a power of two"),
        (
            {"kv": TensorMeta("bfloat16", (100, 64, 576), "cuda:1", True)},
            "kv_indices must be a table [B, max_pages] of page ids for page size 64",
        ),
        ({"kv_indices": TensorMeta("int32", (4000,), "cuda:1", False, (2,))}, "kv_indices must be contiguous"),
        ({"lse": TensorMeta("float32", (B, Q), "cuda:1", True)}, "lse must be [4, 9, 8]"),
        ({"lse": TensorMeta("bfloat16", (B, Q, H), "cuda:1", True)}, "lse must be float32"),
        ({"kv": TensorMeta("bfloat16", (5000, 576), "cuda:0", True)}, "kv is on cuda:0, q on cuda:1"),
        ({"draft_slots": TensorMeta("int32", (B, Q), "cuda:1", False)}, "draft_slots must be contiguous"),
        ({"out": None}, "out is required"),
    ],
)
def test_each_mistake_is_named(over, needle):
    reason = check_call(_good(**over), q_len=Q, H=H)
    assert reason is not None and needle in reason, reason


def test_the_dense_call_has_the_dense_layout():
    assert call_layout(_good(), q_len=Q, H=H) == Layout.dense(H)


@pytest.mark.parametrize(("dtype", "width"), [("uint16", 2), ("int16", 2), ("uint32", 4), ("int32", 4), ("uint64", 8)])
def test_packed_masks_are_read_at_their_width(dtype, width):
    lay = call_layout(_good(tree_mask=TensorMeta(dtype, (B, Q), "cuda:1", True)), q_len=Q, H=H)
    assert lay.mask_bytes == width


def test_q_nope_and_q_pe_are_read_through_their_strides():
    # q_nope a view of a [B*Q, H, 512 + 64 + 64] buffer, q_pe a separate [B, Q, H, 64] tensor
    nope = TensorMeta("bfloat16", (B, Q, H, 512), "cuda:1", False, (Q * H * 640, H * 640, 640, 1), 1 << 20)
    pe = TensorMeta("bfloat16", (B, Q, H, 64), "cuda:1", True)
    lay = call_layout(_good(q=nope, q_pe=pe), q_len=Q, H=H)
    assert (lay.q_st, lay.q_sh, lay.pe_st, lay.pe_sh) == (H * 640, 640, H * 64, 64)


@pytest.mark.parametrize(
    ("q", "pe", "needle"),
    [
        (TensorMeta("bfloat16", (B, Q, H, 576), "cuda:1", False, (Q * H * 1152, H * 576, 576, 2)), None, "last dim"),
        (
            TensorMeta("bfloat16", (B, Q, H, 576), "cuda:1", False, (H * 576, B * H * 576, 576, 1)),
            None,
            "batch and q_len dimensions must merge",
        ),
        (TensorMeta("bfloat16", (B, Q, H, 576), "cuda:1", True, (), 8), None, "16-byte aligned"),
        (TensorMeta("bfloat16", (B, Q, H, 512), "cuda:1", True), None, "q must be [*, 9, 8, 576]"),
        (
            TensorMeta("bfloat16", (B, Q, H, 512), "cuda:1", True),
            TensorMeta("bfloat16", (B, Q, H, 32), "cuda:1", True),
            "q_pe must be [4, 9, 8, 64]",
        ),
        (
            TensorMeta("bfloat16", (B, Q, H, 576), "cuda:1", True),
            TensorMeta("bfloat16", (B, Q, H, 64), "cuda:1", True),
            "q must be [*, 9, 8, 512] when q_pe is given",
        ),
    ],
)
def test_q_that_cannot_be_read_in_place_is_named(q, pe, needle):
    reason = check_call(_good(q=q, q_pe=pe), q_len=Q, H=H)
    assert reason is not None and needle in reason, reason


@pytest.mark.parametrize("bs", [1, 228, 229, 4096])
def test_sglang_s_head_major_q_is_read_in_place_at_any_token_count(bs):
    """SGLang's absorbed q_nope is bmm(q.transpose(0, 1), w_kc).transpose(0, 1): [T, H, 512] with
    strides (512, T * 512, 1). The kernel offsets rows in 64 bits, so past 2048 tokens (bs 228 at
    q_len 9, refused before) it is still read in place."""
    T, heads = bs * Q, 128
    nope = TensorMeta("bfloat16", (bs, Q, heads, 512), "cuda:1", False, (Q * 512, 512, T * 512, 1), 1 << 20)
    pe = TensorMeta("bfloat16", (bs, Q, heads, 64), "cuda:1", False, (Q * heads * 192, heads * 192, 192, 1), 1 << 24)
    t = _good(q=nope, q_pe=pe, kv_indptr=TensorMeta("int32", (bs + 1,), "cuda:1", True))
    t.update({n: TensorMeta(t[n].dtype, (bs, Q), "cuda:1", True) for n in ("draft_slots", "tree_mask")})
    t["out"] = TensorMeta("bfloat16", (bs, Q, heads, 512), "cuda:1", True)
    t["lse"] = TensorMeta("float32", (bs, Q, heads), "cuda:1", True)
    lay = call_layout(t, q_len=Q, H=heads)
    assert (lay.q_st, lay.q_sh, lay.pe_st, lay.pe_sh) == (512, T * 512, heads * 192, 192)


def test_a_stride_past_the_kernel_s_int_argument_is_named():
    big = 2**31  # one element past what an int stride argument holds
    nope = TensorMeta("bfloat16", (B, Q, H, 512), "cuda:1", False, (Q * 512, 512, big, 1))
    reason = check_call(_good(q=nope, q_pe=TensorMeta("bfloat16", (B, Q, H, 64), "cuda:1", True)), q_len=Q, H=H)
    assert reason is not None and "do not fit the kernel's 32-bit stride arguments" in reason, reason
    ok = TensorMeta("bfloat16", (B, Q, H, 512), "cuda:1", False, (Q * 512, 512, big - 8, 1))
    assert check_call(_good(q=ok, q_pe=TensorMeta("bfloat16", (B, Q, H, 64), "cuda:1", True)), q_len=Q, H=H) is None


def test_a_paged_pool_takes_a_page_table_row_per_request():
    kv = TensorMeta("bfloat16", (100, 64, 576), "cuda:1", True)
    table = TensorMeta("int32", (B, 40), "cuda:1", False, (48, 1))  # rows padded to 48 entries
    lay = call_layout(_good(kv=kv, kv_indices=table), q_len=Q, H=H)
    assert (lay.page_shift, lay.page_stride) == (6, 48)
    ones = TensorMeta("bfloat16", (100, 1, 576), "cuda:1", True)
    assert call_layout(_good(kv=ones), q_len=Q, H=H).page_shift == 0


def test_sglang_req_to_token_is_read_in_place_through_kv_rows():
    table = TensorMeta("int32", (4096, 131072), "cuda:1", True)  # [max running requests, max context]
    rows = TensorMeta("int32", (B,), "cuda:1", True)
    lay = call_layout(_good(kv_indices=table, kv_rows=rows), q_len=Q, H=H)
    assert (lay.page_shift, lay.page_stride) == (0, 131072)


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"kv_rows": TensorMeta("int32", (B,), "cuda:1", True)}, "kv_rows picks rows of a table"),
        (
            {"kv_indices": TensorMeta("int32", (9, 100), "cuda:1", True)},
            "kv_indices must be [4, *] (a row per request) without kv_rows",
        ),
        (
            {
                "kv_indices": TensorMeta("int32", (9, 100), "cuda:1", True),
                "kv_rows": TensorMeta("int64", (B,), "cuda:1", True),
            },
            "kv_rows must be int32 [4]",
        ),
        (
            {
                "kv_indices": TensorMeta("int32", (9, 100), "cuda:1", True),
                "kv_rows": TensorMeta("int32", (B,), "cuda:0", True),
            },
            "kv_rows is on cuda:0",
        ),
        ({"kv_indices": TensorMeta("int32", (B, 100), "cuda:1", False, (1, B))}, "rows must be contiguous"),
        ({"kv_indices": TensorMeta("int32", (B, 2, 3), "cuda:1", True)}, "flat slots or a 2-d table"),
    ],
)
def test_table_mistakes_are_named(over, needle):
    reason = check_call(_good(**over), q_len=Q, H=H)
    assert reason is not None and needle in reason, reason


def test_the_kernel_arguments_carry_the_layout():
    spec = LaunchSpec(KernelConfig(nsplit=132, ht=8, tk=32, block=256), H=H, q_len=Q)
    lay = Layout(q_st=5120, q_sh=640, pe_st=512, pe_sh=64, page_shift=6, page_stride=48, mask_bytes=2)
    ptrs = {
        "kv": 2,
        "prefix_indices": 3,
        "prefix_indptr": 4,
        "draft_indices": 5,
        "tree_mask": 6,
        "part_o": 7,
        "part_lse": 8,
        "out": 9,
    }
    args = spec.partial_args(q=1 << 20, q_pe=1 << 21, lse=0, batch=3, softmax_scale=1.0, layout=lay, **ptrs)
    assert len(args) == len(PARTIAL_ARGS)
    assert args[:2] == (1 << 20, 1 << 21) and args[12:-3] == (3, H, 5120, 640, 512, 64, 6, 48, 2)
    assert args[4] == 0  # no kv_rows: request b reads row b
    assert args[-2:] == (0, 1.0)  # no device scale, a scale of 1 (a bf16 kernel reads neither)
    dense = spec.partial_args(q=1 << 20, lse=0, batch=3, softmax_scale=1.0, prefix_rows=11, **ptrs)
    assert dense[1] == (1 << 20) + 1024 and dense[4] == 11
    assert dense[14:-3] == (H * 576, 576, H * 576, 576, 0, 0, 8)
    scaled = spec.partial_args(q=1, lse=0, batch=3, softmax_scale=1.0, kv_scale=0.25, kv_scale_ptr=77, **ptrs)
    assert scaled[-2:] == (77, 0.25)


def test_the_argument_letters_follow_the_kernels_signatures():
    """PARTIAL_ARGS / REDUCE_ARGS spell the .cu's parameters in order (pointer P, int i, float f):
    a parameter added to the kernel but not here would shift every argument after it."""
    src = SOURCE.read_text()
    kernels = (
        ("verify_attn_partial", PARTIAL_ARGS),
        ("verify_attn_reduce", REDUCE_ARGS),
        ("verify_attn_reduce16", REDUCE_ARGS),
    )
    for name, letters in kernels:
        head = src.split(f"\n{name}(", 1)[1].split("{", 1)[0]  # the parameter list, comments and all
        params = "".join(line.split("//")[0] for line in head.splitlines()).rsplit(")", 1)[0]
        kinds = ["P" if "*" in p else "f" if p.split()[0] == "float" else "i" for p in params.split(",")]
        assert "".join(kinds) == letters, name


def test_cpu_tensors_are_refused():
    cpu = {k: TensorMeta(m.dtype, m.shape, "cpu", True) for k, m in _good().items()}
    assert "CUDA device" in check_call(cpu, q_len=Q, H=H)


def test_q_len_and_heads_come_from_q():
    assert "q must be [*, 16, 8, 576]" in check_call(_good(), q_len=16, H=H)


def test_the_grid_is_the_same_for_every_batch_and_the_workspace_follows_the_plan():
    spec = LaunchSpec(KernelConfig(nsplit=132, ht=4, tk=32, block=256, qt=3), H=8, q_len=9)
    assert spec.partial_grid() == (132, 2 * 3, 1)
    assert spec.workspace_rows(1) == 132 * 9 * 8 and spec.workspace_rows(32) == (132 + 31) * 9 * 8


@pytest.mark.parametrize("max_pieces", [4, 16])
@pytest.mark.parametrize("batch", [1, 2, 8, 32, 256, 4096])
def test_reduce_grid_covers_every_item_within_a_block_s_threads(batch, max_pieces):
    blocks, per, pieces = reduce_grid(batch=batch, q_len=9, H=8, sm_count=132, threads=256, max_pieces=max_pieces)
    assert pieces == 4  # 72 rows already give 288 items: more than the SMs
    items = batch * 9 * 8 * pieces
    assert blocks * per >= items and per <= 256 and blocks <= max(items, 1)
    if batch == 1:
        assert per == 1  # one long request: every item its own block


@pytest.mark.parametrize(
    ("q_len", "H", "max_pieces", "want"),
    [(1, 8, 16, 16), (1, 8, 4, 4), (1, 16, 16, 16), (2, 16, 16, 16), (3, 16, 16, 4), (1, 64, 16, 4), (9, 8, 16, 4)],
)
def test_reduce_grid_cuts_few_rows_into_more_pieces_up_to_the_cubin_s_limit(q_len, H, max_pieces, want):
    """H=8 q=1 has 8 rows: at 4 pieces a row its merge ran on 32 of 132 SMs."""
    for batch in (1, 32):
        blocks, per, pieces = reduce_grid(
            batch=batch, q_len=q_len, H=H, sm_count=132, threads=256, max_pieces=max_pieces
        )
        assert pieces == want
        items = batch * q_len * H * pieces
        assert blocks * per >= items and blocks <= items and per <= 256
    if max_pieces == 16 and q_len * H <= 16:
        assert reduce_grid(batch=1, q_len=q_len, H=H, sm_count=132, threads=256, max_pieces=16)[0] >= 128


def test_a_launchs_packed_arguments_are_what_the_driver_reads_and_are_rewritten_in_place():
    """kernels/runtime.PackedArgs: the address it returns is a void* array whose entries point at
    the values in the kernel's order and types; the next fill rewrites the same block."""
    import ctypes
    import struct

    from verify_tuner.kernels.runtime import PackedArgs

    packed = PackedArgs("PiPf")
    addr = packed.fill((0x7F00_0000_1000, 9, 0, 0.25))
    slots = (ctypes.c_void_p * 4).from_address(addr)
    read = [ctypes.c_void_p.from_address(slots[0]).value, ctypes.c_int.from_address(slots[1]).value,
            ctypes.c_void_p.from_address(slots[2]).value, ctypes.c_float.from_address(slots[3]).value]  # fmt: skip
    assert read == [0x7F00_0000_1000, 9, None, 0.25]
    assert packed.fill((1, -3, 2, 1.5)) == addr and ctypes.c_int.from_address(slots[1]).value == -3
    with pytest.raises(struct.error):
        packed.fill((1, 2, 3))  # a count that does not match the kernel's signature is a bug
