"""The KV formats table and what reads it: validation, the ABI's pool checks, the cost model and
the reference's quantized pools (CPU only)."""

from __future__ import annotations

import dataclasses

import pytest
from verify_tuner.kernels import formats
from verify_tuner.kernels.abi import TensorMeta, check_call
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.limits import KNOWN_DEVICES
from verify_tuner.kernels.shapes import floor_bytes
from verify_tuner.kernels.validate import check, smem_bytes

H200 = KNOWN_DEVICES["NVIDIA H200"]
CFG = KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3)


def test_every_format_is_one_consistent_row():
    codes = [f.code for f in formats.FORMATS.values()]
    assert len(set(codes)) == len(codes)  # KV_FMT values are unique
    for name, f in formats.FORMATS.items():
        assert f.name == name and f.about
        for dtype in f.pool_dtypes:
            assert f.pool_row_elems(dtype) * formats.ITEMSIZE[dtype] == f.row_bytes
    assert formats.FORMATS["bf16"].row_bytes == 576 * 2 and formats.FORMATS["fp8_e4m3"].row_bytes == 576
    assert formats.FORMATS["fp8_ds_mla"].row_bytes == 512 + 4 * 4 + 64 * 2  # FlashMLA's 656-byte rows
    assert formats.DEFAULT in formats.KV_DTYPES


def test_an_unknown_format_is_refused_naming_the_known_ones():
    with pytest.raises(InvalidConfig, match=r"unknown kv_dtype 'fp4'.*bf16, fp8_e4m3"):
        formats.kv_format("fp4")
    assert "unknown kv_dtype 'fp4'" in check(CFG, H200, H=8, q_len=9, kv_dtype="fp4")


def test_a_format_the_kernel_does_not_read_is_refused_by_name(monkeypatch):
    """A row listed ahead of its kernel code (as fp8_ds_mla was) is refused by name, not as unknown."""
    listed = dataclasses.replace(formats.FORMATS["fp8_e4m3"], name="fp8_e5m2", code=9, kernel_reads=False)
    monkeypatch.setitem(formats.FORMATS, "fp8_e5m2", listed)
    reason = check(CFG, H200, H=8, q_len=9, kv_dtype="fp8_e5m2")
    assert reason is not None and "kv_dtype fp8_e5m2" in reason and "not read by this kernel" in reason
    with pytest.raises(InvalidConfig, match="fp8_e5m2"):
        formats.readable("fp8_e5m2")
    assert all(f.kernel_reads for f in formats.FORMATS.values() if f.name != "fp8_e5m2")


def test_a_withheld_format_is_refused_with_its_reason_unless_a_process_names_it(monkeypatch):
    """fp8_ds_mla is built but its GPU tests fail: a process that does not name it in
    $VERIFY_TUNER_RUN_WITHHELD (a server, the op, the tuner) refuses it everywhere with that reason
    and leaves it out of the accepted formats; its GPU tests and diagnostics name it to run it."""
    from verify_tuner.keys import check_kv_dtype

    monkeypatch.delenv(formats.RUN_WITHHELD_ENV, raising=False)
    reason = check(CFG, H200, H=8, q_len=9, kv_dtype="fp8_ds_mla")
    assert reason is not None and reason.startswith("kv_dtype fp8_ds_mla is withheld: its GPU tests fail"), reason
    with pytest.raises(InvalidConfig, match="withheld"):
        formats.readable("fp8_ds_mla", 90)
    with pytest.raises(ValueError, match=r"withheld.*\(accepted: bf16, fp8_e4m3, fp8_e4m3_qk\)$"):
        check_kv_dtype("fp8_ds_mla")
    assert check(CFG, H200, H=8, q_len=9, kv_dtype="fp8_e4m3") is None  # the others are served as before
    monkeypatch.setenv(formats.RUN_WITHHELD_ENV, "fp8_e4m3_qk,fp8_ds_mla")
    assert check(CFG, H200, H=8, q_len=9, kv_dtype="fp8_ds_mla") is None
    assert [f.name for f in formats.FORMATS.values() if f.withheld] == ["fp8_ds_mla"]


def test_a_mode_needs_the_instructions_of_its_arch():
    qk = formats.FORMATS["fp8_e4m3_qk"]
    assert qk.min_cc == 89  # mma.sync .e4m3 exists from sm_89 (emulated on sm_90, native on sm_120)
    reason = formats.KVFormat(**{**qk.__dict__, "kernel_reads": True}).unsupported_reason(80)
    assert reason == "kv_dtype fp8_e4m3_qk needs compute capability 8.9+, the device has 8.0"


def test_the_cost_model_counts_the_cache_in_its_format():
    bf16 = floor_bytes([46000], q_len=9, H=8)
    fp8 = floor_bytes([46000], q_len=9, H=8, kv_dtype="fp8_e4m3")
    qo = 9 * 8 * (576 + 512) * 2  # q in and o out stay bf16
    assert bf16 == 46009 * 1152 + qo and fp8 == 46009 * 576 + qo


def test_shared_memory_follows_the_staged_element_size():
    assert smem_bytes(CFG, 9) == smem_bytes(CFG, 9, "bf16") == 227448  # the seesaw default at 72 rows


def test_an_e4m3_ring_keeps_the_pools_rows_in_half_a_bf16_one():
    """Both e4m3 formats keep 576-byte e4m3 rows at a 592-byte stride in the ring: 3 slots of 32
    tokens take 56 832 bytes instead of bf16's 110 592, while Q, P and the rest are the same size."""
    bf16_ring, e4m3_ring = 3 * 32 * 1152, 3 * 32 * 592
    q_scales = 72 * 4  # e4m3's q row scale, a float a row
    want = smem_bytes(CFG, 9, "bf16") - bf16_ring + e4m3_ring + q_scales
    assert smem_bytes(CFG, 9, "fp8_e4m3") == smem_bytes(CFG, 9, "fp8_e4m3_qk") == want
    per_layer = {f.ring_row_bytes for f in formats.FORMATS.values() if f.element == "e4m3" and f.scale == "per_layer"}
    assert per_layer == {592}


def test_the_ds_mla_ring_keeps_flashmlas_rows_as_stored():
    """fp8_ds_mla's 656-byte rows (41 chunks, odd: no swizzle needed) sit in the ring as the pool
    holds them; q keeps its row scales; its k-slices must end on the 4 rope k-steps."""
    f = formats.FORMATS["fp8_ds_mla"]
    assert f.ring_row_bytes == f.row_bytes == 656 and (656 // 16) % 2 == 1
    want = smem_bytes(CFG, 9, "fp8_e4m3") - 3 * 32 * 592 + 3 * 32 * 656
    assert smem_bytes(CFG, 9, "fp8_ds_mla") == want
    assert check(CFG, H200, H=8, q_len=9, kv_dtype="fp8_ds_mla") is None  # WK=2
    for wk in (3, 6):  # in the space's WK choices (no block size has a warp count they divide)
        cfg = dataclasses.replace(CFG, wk=wk, sf=0, pipe=0, stages=2, wr=1)
        assert "rope" not in str(check(cfg, H200, H=8, q_len=9, kv_dtype="fp8_e4m3"))
        reason = check(cfg, H200, H=8, q_len=9, kv_dtype="fp8_ds_mla")
        assert reason is not None and f"WK={wk} does not divide the 4 rope k-steps" in reason


def _call(kv_dtype_storage: str, width: int = 576) -> dict[str, TensorMeta]:
    B, Q, H = 2, 9, 8
    dev = "cuda:0"
    return {
        "q": TensorMeta("bfloat16", (B, Q, H, 576), dev, True, address=0),
        "kv": TensorMeta(kv_dtype_storage, (100, width), dev, True),
        "kv_indptr": TensorMeta("int32", (B + 1,), dev, True),
        "kv_indices": TensorMeta("int32", (50,), dev, True),
        "draft_slots": TensorMeta("int32", (B, Q), dev, True),
        "tree_mask": TensorMeta("int64", (B, Q), dev, True),
        "out": TensorMeta("bfloat16", (B, Q, H, 512), dev, True),
    }


def test_the_abi_checks_the_pool_against_its_format():
    assert check_call(_call("bfloat16"), q_len=9, H=8) is None
    assert check_call(_call("uint8"), q_len=9, H=8) == "kv must be bfloat16 for kv_dtype bf16, got uint8"
    for storage in ("uint8", "float8_e4m3fn"):
        assert check_call(_call(storage), q_len=9, H=8, kv_dtype="fp8_e4m3") is None
    assert check_call(_call("bfloat16"), q_len=9, H=8, kv_dtype="fp8_e4m3") == (
        "kv must be uint8 or float8_e4m3fn for kv_dtype fp8_e4m3, got bfloat16"
    )
    assert "kv must be [*, 576]" in check_call(_call("uint8", 656), q_len=9, H=8, kv_dtype="fp8_e4m3")
    for storage in ("uint8", "float8_e4m3fn"):  # FlashMLA's rows: 656 bytes, as uint8 or torch's fp8
        assert check_call(_call(storage, 656), q_len=9, H=8, kv_dtype="fp8_ds_mla") is None
    assert "kv must be [*, 656]" in check_call(_call("uint8", 576), q_len=9, H=8, kv_dtype="fp8_ds_mla")


def test_a_format_whose_rows_carry_scales_refuses_a_layer_scale():
    from verify_tuner.kernels.abi import check_scale

    check_scale("fp8_ds_mla", 1.0, False)
    check_scale("fp8_e4m3", 0.5, True)
    for scale, tensor in ((0.5, False), (1.0, True)):
        with pytest.raises(ValueError, match="fp8_ds_mla's rows carry their own scales and take no kv_scale"):
            check_scale("fp8_ds_mla", scale, tensor)
    with pytest.raises(ValueError, match="is read as stored and takes no kv_scale"):
        check_scale("bf16", 0.5, False)


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("pool_dtype", ["uint8", "float8_e4m3fn"])
def test_the_reference_computes_on_the_dequantized_cache(pool_dtype):
    from verify_tuner.kernels.reference import make_inputs, reference

    inp = make_inputs(prefix_lens=[40, 7], q_len=3, H=2, device="cpu", kv_dtype="fp8_e4m3", pool_dtype=pool_dtype)
    assert str(inp.kv.dtype) == f"torch.{pool_dtype}" and inp.kv.shape == (47 + 6, 576)
    assert inp.kv_scale == pytest.approx(float(inp.kv_unquantized.float().abs().max()) / 448)
    deq = inp.dequantized_kv()
    # e4m3 keeps 3 mantissa bits: every value within half an ulp (2^-4 relative) of its source
    src = inp.kv_unquantized.float()
    assert ((deq - src).abs() <= src.abs() * 2**-4 + inp.kv_scale * 2**-9).all()
    o, lse = reference(inp)
    # the reference reads exactly those values: the same inputs with the fp32 values as the pool agree
    plain = dataclasses.replace(inp, kv=deq, kv_dtype="bf16", kv_scale=1.0)
    o2, lse2 = reference(plain)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    # and not the unquantized ones (the error against those is information for users, not the gate)
    o3, _ = reference(dataclasses.replace(inp, kv=inp.kv_unquantized, kv_dtype="bf16", kv_scale=1.0))
    assert 1e-3 < float((o - o3).norm() / o3.norm()) < 0.1


@pytest.mark.parametrize("pool_dtype", ["uint8", "float8_e4m3fn"])
def test_the_reference_reads_flashmlas_rows(pool_dtype):
    """fp8_ds_mla pools as FlashMLA lays them out: per row 512 e4m3, the 4 fp32 scales (amax / 448 of
    each 128 dims) at byte 512, the 64 rope dims as bf16 at byte 528; the reference computes on
    those values, and the paged layout is the same rows."""
    from verify_tuner.kernels.reference import ds_mla_rows, make_inputs, reference

    inp = make_inputs(prefix_lens=[40, 7], q_len=3, H=2, device="cpu", kv_dtype="fp8_ds_mla", pool_dtype=pool_dtype)
    assert str(inp.kv.dtype) == f"torch.{pool_dtype}" and inp.kv.shape == (47 + 6, 656) and inp.kv_scale == 1.0
    src = inp.kv_unquantized.float()
    b = inp.kv.view(torch.uint8)
    scales = b[:, 512:528].contiguous().view(torch.float32)
    amax = src[:, :512].reshape(-1, 4, 128).abs().amax(-1)
    assert torch.equal(scales, torch.where(amax > 0, amax / 448, torch.ones_like(amax)))
    assert torch.equal(b[:, 528:].contiguous().view(torch.bfloat16).float(), src[:, 512:])  # the rope as stored
    deq = inp.dequantized_kv()
    assert torch.equal(deq[:, 512:], src[:, 512:])
    err = (deq[:, :512] - src[:, :512]).abs().reshape(-1, 4, 128)
    assert (err <= src[:, :512].reshape(-1, 4, 128).abs() * 2**-4 + scales.unsqueeze(-1) * 2**-9).all()
    o, lse = reference(inp)
    o2, lse2 = reference(dataclasses.replace(inp, kv=deq, kv_dtype="bf16"))
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    paged = make_inputs(prefix_lens=[40, 7], q_len=3, H=2, device="cpu", kv_dtype="fp8_ds_mla", page_size=16)
    assert paged.kv.shape[1:] == (16, 656) and paged.dequantized_kv().shape == (paged.kv.shape[0] * 16, 576)
    pow2 = ds_mla_rows(inp.kv_unquantized, pow2_scales=True)[:, 512:528].contiguous().view(torch.float32)
    assert torch.equal(torch.exp2(torch.log2(pow2).round()), pow2) and (pow2 >= scales).all()


def test_sm80s_bit_placement_is_e4m3_times_2_to_the_minus_8():
    """The .cu's e4m3x4_to_f16x4 on sm_80 (no fp8 conversion there) places each byte's sign and
    magnitude bits into an f16: every finite e4m3 value, subnormals included, comes out times 2^-8
    exactly, which F8_UNIT (256) undoes. This is that formula, over all 256 bytes."""
    import numpy as np

    b = torch.arange(256, dtype=torch.int32)
    t = b << 8  # the byte at bits 8..15, as __byte_perm places it
    f16_bits = (t & 0x8000) | ((t >> 1) & 0x3F80)
    placed = torch.from_numpy(f16_bits.numpy().astype(np.uint16).view(np.float16).astype(np.float32))
    truth = b.to(torch.uint8).view(torch.float8_e4m3fn).float()
    finite = torch.isfinite(truth)
    assert int(finite.sum()) == 254  # 0x7F and 0xFF are e4m3's NaNs; an engine never stores them
    assert torch.equal(placed[finite] * 256, truth[finite])


def test_the_qk_modes_reference_quantizes_each_q_row_as_the_kernel_does():
    """fp8_e4m3_qk computes QK on e4m3 q: each (token, head) row scaled so its largest |q| is 448,
    rounded to nearest, scaled back. The reference computes on that q (the kernel's task), so the
    kernel is gated as strictly as the dequantizing mode; the rows' own error is e4m3's."""
    from verify_tuner.kernels.reference import make_inputs, quantized_q, reference

    inp = make_inputs(prefix_lens=[40, 7], q_len=3, H=2, device="cpu", kv_dtype="fp8_e4m3_qk")
    q = inp.full_q().float()
    qq = quantized_q(inp.full_q(), "fp8_e4m3_qk")
    amax = q.abs().amax(dim=-1, keepdim=True)
    # each row's largest |q| lands on 448 exactly (up to the fp32 round trip of its scale)
    torch.testing.assert_close(qq.abs().amax(dim=-1, keepdim=True), amax, rtol=1e-6, atol=0)
    assert ((qq - q).abs() <= q.abs() * 2**-4 + amax / 448 * 2**-9).all()  # half an e4m3 ulp, subnormals
    assert not torch.equal(qq, q)
    assert torch.equal(quantized_q(inp.full_q(), "fp8_e4m3"), q)  # the dequantizing mode keeps q
    zero = torch.zeros(1, 576, dtype=torch.bfloat16)
    assert torch.equal(quantized_q(zero, "fp8_e4m3_qk"), zero.float())  # a zero row stays zero, no NaN
    o, _ = reference(inp)
    o_deq, _ = reference(dataclasses.replace(inp, kv_dtype="fp8_e4m3"))  # same cache, q as given
    assert 1e-4 < float((o - o_deq).norm() / o_deq.norm()) < 0.1


def test_the_qk_modes_q_scale_is_one_rounded_division_as_the_kernels():
    """The kernel's prologue scales a row by __fdiv_rn(448, amax), one correctly rounded fp32
    quotient. bf16 q values often sit exactly on an e4m3 rounding tie once scaled (amax and q share
    8-bit significands), so a scale one ulp off -- torch's `448 / tensor` is 448 times the rounded
    reciprocal -- rounds them the other way: on an H100 that moved 266 of 4608 scores by up to 0.14
    (bench/fp8_qk_probe.py --scores). Each row here is checked against the kernel's arithmetic,
    emulated in numpy: the quotient in float64 then float32 (for a division that is the correctly
    rounded float32 quotient), the product in float32, e4m3's round-to-nearest-even."""
    import numpy as np
    from verify_tuner.kernels.reference import E4M3_MAX, quantized_q

    gen = torch.Generator().manual_seed(3)
    q = (torch.randn(4096, 576, generator=gen) * 2).to(torch.bfloat16)
    x = q.float().numpy()
    amax = np.abs(x).max(axis=-1, keepdims=True)
    mul = (E4M3_MAX / amax.astype(np.float64)).astype(np.float32)
    want = torch.from_numpy(x * mul).to(torch.float8_e4m3fn).float() / torch.from_numpy(mul)
    assert torch.equal(quantized_q(q, "fp8_e4m3_qk"), want)
    # the double rounding differs on these rows (the check above fails on it)
    twice = torch.from_numpy(x * (np.float32(E4M3_MAX) * (np.float32(1) / amax))).to(torch.float8_e4m3fn).float()
    assert not torch.equal(twice / torch.from_numpy(mul), want)
