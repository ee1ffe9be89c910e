"""Stand-ins for the SGLang objects an attention backend is handed (facts from SGLang 0.5.23's
released source: ForwardMode, ForwardBatch's fields, RadixAttention's attributes, the
MLATokenToKVPool's methods, a verify SpecInput), the op as its fp32 reference, and attention
computed straight from SGLang's own tensors -- the mask read in its own layout -- to check the
backend's conversions against.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch
from verify_tuner.kernels.abi import TensorMeta, call_layout, check_scale
from verify_tuner.kernels.reference import Inputs, reference

from tests.engine.sglang_trees import FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    MIXED = 3
    IDLE = 4
    TARGET_VERIFY = 5
    DRAFT_EXTEND_V2 = 6

    def is_target_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE

    def is_decode_or_idle(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.IDLE)

    def is_mixed(self) -> bool:
        return self == ForwardMode.MIXED


@dataclass
class SpecInfo:
    custom_mask: torch.Tensor | None
    draft_token_num: int
    topk: int = 1
    ragged_verify_layout: Any = None


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    seq_lens: torch.Tensor  # int64 [bs]: verify's without the draft tokens, decode's with its own token
    req_pool_indices: torch.Tensor  # int64 [bs]
    out_cache_loc: torch.Tensor  # int64 [bs * q_len]
    spec_info: SpecInfo | None = None
    seq_lens_cpu: torch.Tensor | None = None  # seq_lens' host copy, where a backend needs_cpu_seq_lens
    original_global_num_tokens_cpu: list[int] | None = None  # under DP attention: each rank's requests
    actual_forward_mode: ForwardMode | None = None  # a replay's view: the step's own mode (IDLE on an idle rank)


@dataclass
class Layer:
    """RadixAttention's attributes an MLA backend reads (attn_mqa: 576-wide qk, 512-wide v, one kv head)."""

    layer_id: int
    tp_q_head_num: int
    scaling: float
    head_dim: int = 576
    qk_head_dim: int = 576
    v_head_dim: int = 512
    tp_k_head_num: int = 1
    k_scale: Any = None  # a 0-d float32 tensor where the model has a quant config (1.0 without KV scales)
    k_scale_float: float | None = None  # the same on the host (SGLang's kv_cache.py sets both)


@dataclass
class MLAPool:
    """MLATokenToKVPool's surface: [size + page_size, 1, 576] per layer, page size 1."""

    size: int
    layers: int
    dtype: torch.dtype = torch.bfloat16
    device: str = "cpu"
    kv_buffer: list[torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        gen = torch.Generator(device=self.device).manual_seed(self.size)
        self.kv_buffer = [
            torch.randn(self.size + 1, 1, 576, generator=gen, device=self.device).to(self.dtype)
            for _ in range(self.layers)
        ]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id]

    def set_mla_kv_buffer(self, layer: Layer, loc: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor) -> None:
        buf = self.kv_buffer[layer.layer_id]
        buf[loc, :, :512] = k_nope.to(buf.dtype)
        buf[loc, :, 512:] = k_rope.to(buf.dtype)

    def set_kv_buffer(self, layer: Layer, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.kv_buffer[layer.layer_id][loc] = k.to(self.dtype)


class ReferenceOp:
    """The op's signature, computed by the fp32 reference after the op's own checks of the layout
    (kernels/abi.py, as on the GPU but for the device); records each call's arguments."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self, q, q_pe, kv, kv_indptr, kv_indices, kv_rows, draft, mask, out, lse, config, scale, workspace,
        kv_dtype="bf16", kv_scale=1.0, kv_scale_tensor=None,
    ):  # fmt: skip
        names = ("q", "q_pe", "kv", "kv_indptr", "kv_indices", "kv_rows", "draft_slots", "tree_mask", "out", "lse")
        tensors = dict(zip(names, (q, q_pe, kv, kv_indptr, kv_indices, kv_rows, draft, mask, out, lse)))
        metas = {k: TensorMeta.of(v) for k, v in tensors.items()}
        call_layout(metas, q_len=q.shape[1], H=q.shape[2], on_cuda=False, kv_dtype=kv_dtype)
        check_scale(kv_dtype, kv_scale, kv_scale_tensor is not None)
        layer_scale = float(kv_scale_tensor) if kv_scale_tensor is not None else kv_scale
        inp = Inputs(
            q=q, q_pe=q_pe, kv=kv, prefix_indices=kv_indices, prefix_indptr=kv_indptr, draft_indices=draft,
            tree_mask=mask, scale=scale, prefix_rows=kv_rows, kv_dtype=kv_dtype, kv_scale=layer_scale,
        )  # fmt: skip
        out.copy_(reference(inp)[0])
        self.calls.append({"config": config, "workspace": workspace, "scale": scale, "q": q, "q_pe": q_pe,
                           "kv_dtype": kv_dtype, "kv_scale": layer_scale})  # fmt: skip


class Delegate:
    """Records what the backend hands to SGLang's Triton backend."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str):
        def record(*args: Any, **kwargs: Any) -> str:
            self.calls.append((name, args))
            return f"delegated {name}"

        return record


def sglang_attention(
    *,
    kv: torch.Tensor,
    req_to_token: torch.Tensor,
    fb: ForwardBatch,
    q: torch.Tensor,
    mode: int,
    q_len: int,
    scale: float,
) -> torch.Tensor:
    """fp32 attention straight from SGLang's tensors: request b's prefix req_to_token[row, :seq_len]
    then its draft slots, node i seeing what its row of SGLang's mask (FULL_MASK or QLEN_ONLY
    cells, in that layout) allows. Decode reads as SGLang's Triton backend does: req_to_token[row,
    :seq_len] alone, whose last slot is the step's own token. q [T, H, 576]; returns [T, H, 512]."""
    kv2 = kv.reshape(-1, 576).float()
    if fb.forward_mode.is_decode():
        assert q_len == 1, "SGLang decodes one token a request"
        keys = [kv2[req_to_token[row, :n].long()] for n, row in zip(fb.seq_lens.tolist(), fb.req_pool_indices.tolist())]
        return torch.stack(
            [torch.softmax((q[b].float() @ k.T) * scale, dim=-1) @ k[:, :512] for b, k in enumerate(keys)]
        )
    out, start = [], 0
    lens, rows = fb.seq_lens.tolist(), fb.req_pool_indices.tolist()
    # the mask is read on the host: SGLang builds it on the device, the reference's rows are small
    cells = fb.spec_info.custom_mask if fb.spec_info is not None else None
    cells = cells.cpu() if cells is not None else None
    for b, (n, row) in enumerate(zip(lens, rows)):
        slots = torch.cat([req_to_token[row, :n].long(), fb.out_cache_loc[b * q_len : (b + 1) * q_len].long()])
        k = kv2[slots]
        for i in range(q_len):
            if cells is None:  # a chain
                see = torch.tensor([True] * n + [j <= i for j in range(q_len)])
            elif mode == FULL_MASK:
                see = cells[start + i * (n + q_len) : start + (i + 1) * (n + q_len)].bool()
                see = torch.cat([torch.ones(n, dtype=torch.bool), see[n:]])  # prefix cells: visible however filled
            elif mode == QLEN_ONLY:
                base = (b * q_len + i) * q_len
                see = torch.cat([torch.ones(n, dtype=torch.bool), cells[base : base + q_len].bool()])
            else:
                assert mode == QLEN_ONLY_BITPACKING
                width = cells.element_size()
                raw = cells.view(torch.uint8)[(b * q_len + i) * width : (b * q_len + i + 1) * width].tolist()
                word = sum(byte << (8 * at) for at, byte in enumerate(raw))  # little-endian, as SGLang packs
                see = torch.tensor([True] * n + [bool(word >> j & 1) for j in range(q_len)])
            s = (q[b * q_len + i].float() @ k.T) * scale
            p = torch.softmax(s.masked_fill(~see.to(s.device), float("-inf")), dim=-1)
            out.append(p @ k[:, :512])
        start += q_len * (n + q_len)
    return torch.stack(out)
