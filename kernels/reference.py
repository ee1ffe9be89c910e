"""Inputs, the fp32 torch reference and the poisoned-output check (torch imported lazily).

The reference is the definition of the function: every correctness check (tests, the tuner's
gate) compares against it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from verify_tuner.kernels.formats import DS_MLA_BLOCK, DS_MLA_NOPE, kv_format
from verify_tuner.kernels.shapes import D_QK, D_V, Q_DTYPE


@dataclass
class Inputs:
    q: Any  # [B, Q, H, 576] bf16, or q_nope [B, Q, H, 512] (any strides the op takes) with q_pe
    kv: Any  # [S, 576] in the pool's storage dtype (bf16; e4m3 as uint8 or float8), or [pages, page_size, 576]
    prefix_indices: Any  # int32 [sum P] slots, or a table: a row per request of slots or of page ids
    prefix_indptr: Any  # int32 [B+1]
    draft_indices: Any  # int32 [B, Q]
    tree_mask: Any  # [B, Q] rows of 8..64 bits (int64: the bit pattern of uint64)
    scale: float
    q_pe: Any = None  # [B, Q, H, 64] bf16 when q holds only the 512 latent dims
    prefix_rows: Any = None  # int32 [B]: each request's row of the table (SGLang's req_pool_indices)
    kv_dtype: str = "bf16"  # the cache's format (kernels/formats.py)
    kv_scale: float = 1.0  # a per-layer format's scale: the cache holds values / kv_scale
    kv_unquantized: Any = None  # a quantized pool's bf16 source, for the error against it (information only)

    @property
    def batch(self) -> int:
        return int(self.q.shape[0])

    @property
    def page_size(self) -> int:
        return int(self.kv.shape[1]) if self.kv.dim() == 3 else 1

    def layout(self) -> Any:
        """The kernel's Layout of these tensors (kernels/abi.py checks them as the op does)."""
        from verify_tuner.kernels.abi import TensorMeta, call_layout

        names = {"q": "q", "q_pe": "q_pe", "kv": "kv", "kv_indptr": "prefix_indptr", "kv_indices": "prefix_indices",
                 "kv_rows": "prefix_rows", "draft_slots": "draft_indices", "tree_mask": "tree_mask"}  # fmt: skip
        t = {op_name: TensorMeta.of(getattr(self, name)) for op_name, name in names.items()}
        B, Q, H, _ = self.q.shape
        q = t["q"]
        assert q is not None
        t["out"] = TensorMeta(Q_DTYPE, (B, Q, H, D_V), q.device, True)
        return call_layout(t, q_len=Q, H=H, on_cuda=False, kv_dtype=self.kv_dtype)

    def dequantized_kv(self) -> Any:
        """The pool as fp32 values, [S, 576]: what the kernel is asked to compute on."""
        return dequantize(self.kv, self.kv_dtype, self.kv_scale)

    def full_q(self) -> Any:
        """q as [B, Q, H, 576]."""
        import torch

        return self.q if self.q_pe is None else torch.cat([self.q, self.q_pe], dim=-1)


def random_tree_mask(q_len: int, generator: Any) -> list[int]:
    """A random draft tree: node i's parent is a random earlier node; each sees its ancestors."""
    import torch

    masks: list[int] = []
    for i in range(q_len):
        if i == 0:
            masks.append(1)
            continue
        parent = int(torch.randint(0, i, (1,), generator=generator))
        masks.append(masks[parent] | (1 << i))
    return masks


SLOT_LAYOUTS = ("scattered", "contiguous")


def make_inputs(
    *,
    prefix_lens: list[int],
    q_len: int,
    H: int,
    device: str = "cuda",
    seed: int = 0,
    spare_slots: int = 0,
    scale: float | None = None,
    layout: str = "scattered",
    page_size: int = 1,
    split_q: bool = False,
    mask_dtype: str = "int64",
    req_to_token: bool = False,
    kv_dtype: str = "bf16",
    pool_dtype: str | None = None,
) -> Inputs:
    """Random inputs. Slots are a random permutation of the pool ("scattered", a fragmented
    page-size-1 cache: the worst case for the memory system) or consecutive ("contiguous": each
    request's prefix, then the draft slots, in pool order). page_size > 1 lays the pool out in
    pages with a page table (each request's prefix and then its draft tokens fill its pages, as an
    engine appends them); split_q gives q as q_nope, a strided view of a wider buffer, plus a
    separate q_pe; mask_dtype the tree mask's row type (uint8/16/32 as SGLang packs them);
    req_to_token the prefix slots as rows of a wider table at scattered rows (SGLang's pool of
    requests, read in place through prefix_rows); kv_dtype the cache's format (an e4m3 one
    quantizes the bf16 values with a per-layer scale, fp8_ds_mla with a scale per 128 latent dims
    of each row, stored as `pool_dtype`: uint8, as SGLang's pool holds it, by default, or
    float8_e4m3fn)."""
    import torch

    if layout not in SLOT_LAYOUTS:
        raise ValueError(f"layout must be one of {SLOT_LAYOUTS}, got {layout!r}")
    gen = torch.Generator().manual_seed(seed)
    B = len(prefix_lens)
    prefix_indices, draft, S = _slots(prefix_lens, q_len, page_size, spare_slots, layout, gen)
    indptr = _indptr(prefix_lens)
    q, kv = _values(B, q_len, H, S, page_size, seed, device)
    prefix_indices, rows = (
        _req_to_token(prefix_indices, indptr, prefix_lens, page_size, gen) if req_to_token else (prefix_indices, None)
    )
    q, q_pe = _split_q(q, device) if split_q else (q, None)
    mask = _tree_masks(B, q_len, mask_dtype, gen)
    pool, kv_scale = quantize(kv, kv_dtype, pool_dtype)
    return Inputs(
        q=q.to(device), kv=pool.to(device), prefix_indices=prefix_indices.to(device), prefix_indptr=indptr.to(device),
        draft_indices=draft.to(device), tree_mask=mask.to(device), scale=scale if scale is not None else D_QK**-0.5,
        q_pe=q_pe, prefix_rows=rows.to(device) if rows is not None else None, kv_dtype=kv_dtype, kv_scale=kv_scale,
        kv_unquantized=kv if pool is not kv else None,
    )  # fmt: skip


#: The largest finite e4m3 value (S.1111.110): a per-layer scale maps the cache's amax onto it.
E4M3_MAX = 448.0


def quantize(kv: Any, kv_dtype: str, pool_dtype: str | None = None) -> tuple[Any, float]:
    """(pool, scale): bf16 values as a `kv_dtype` pool, as an engine writes one (SGLang and vLLM
    store round(x / k_scale) as e4m3 with k_scale = amax / 448; fp8_ds_mla rows as FlashMLA's,
    `ds_mla_rows`, with scale 1); bf16 is returned as it is."""
    import torch

    fmt = kv_format(kv_dtype)
    if fmt.element == "bf16":
        return kv, 1.0
    want = pool_dtype or "uint8"
    if want not in fmt.pool_dtypes:
        raise ValueError(f"pool_dtype must be one of {fmt.pool_dtypes} for {kv_dtype}, got {want!r}")
    if fmt.scale == "per_128":
        rows = ds_mla_rows(kv)
        return (rows if want == "uint8" else rows.view(torch.float8_e4m3fn)), 1.0
    if fmt.scale != "per_layer":
        raise ValueError(f"make_inputs does not build {kv_dtype} pools ({fmt.about})")
    scale = max(float(kv.float().abs().max()), 1e-12) / E4M3_MAX
    q8 = (kv.float() / scale).to(torch.float8_e4m3fn)
    return (q8.view(torch.uint8) if want == "uint8" else q8), scale


def ds_mla_rows(kv: Any, *, pow2_scales: bool = False) -> Any:
    """FlashMLA's "fp8 with scale" rows (uint8 [..., 656]) of bf16 latent rows [..., 576]: each 128
    latent dims as e4m3 under the fp32 scale amax / 448 (rounded up to a power of two with
    pow2_scales: UE8M0-style scales, which some writers use; a block of zeros keeps 1), then the 4 scales,
    then the 64 rope dims as bf16."""
    import torch

    x = kv.float()
    lead = x.shape[:-1]
    nope = x[..., :DS_MLA_NOPE].reshape(*lead, DS_MLA_NOPE // DS_MLA_BLOCK, DS_MLA_BLOCK)
    amax = nope.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    if pow2_scales:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q8 = (nope / scale.unsqueeze(-1)).to(torch.float8_e4m3fn).reshape(*lead, DS_MLA_NOPE)
    rope = kv[..., DS_MLA_NOPE:].to(torch.bfloat16).contiguous()
    return torch.cat([q8.view(torch.uint8), scale.contiguous().view(torch.uint8), rope.view(torch.uint8)], dim=-1)


def dequantize(pool: Any, kv_dtype: str, kv_scale: float) -> Any:
    """A `kv_dtype` pool's values in fp32, [S, 576]."""
    import torch

    fmt = kv_format(kv_dtype)
    flat = pool.reshape(-1, pool.shape[-1])
    if fmt.element == "bf16":
        return flat.float()
    if fmt.scale == "per_128":  # FlashMLA's rows: e4m3 latent, its 4 fp32 scales, bf16 rope
        b = flat.view(torch.uint8)
        blocks = DS_MLA_NOPE // DS_MLA_BLOCK
        nope = b[:, :DS_MLA_NOPE].view(torch.float8_e4m3fn).float().reshape(-1, blocks, DS_MLA_BLOCK)
        scales = b[:, DS_MLA_NOPE : DS_MLA_NOPE + 4 * blocks].contiguous().view(torch.float32)
        rope = b[:, DS_MLA_NOPE + 4 * blocks :].contiguous().view(torch.bfloat16).float()
        return torch.cat([(nope * scales.unsqueeze(-1)).reshape(-1, DS_MLA_NOPE), rope], dim=-1)
    if fmt.scale != "per_layer":
        raise ValueError(f"the reference does not read {kv_dtype} pools ({fmt.about})")
    e4m3 = flat.view(torch.float8_e4m3fn) if flat.dtype == torch.uint8 else flat
    return e4m3.float() * kv_scale


def quantized_q(q: Any, kv_dtype: str) -> Any:
    """q as the kernel computes with it, fp32 [..., 576]: for a format whose QK runs on e4m3 MMAs,
    each row quantized to e4m3 with its own scale (its largest |q| onto 448: multiplied by
    448 / amax -- one correctly rounded fp32 division --, rounded to nearest, divided again), as the
    kernel's prologue does; else as given."""
    import torch

    if kv_format(kv_dtype).mma != "e4m3":
        return q.float()
    x = q.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    # a tensor divisor: `448 / tensor` is torch's reciprocal times 448, two roundings, whose last bit
    # moves q values that sit on an e4m3 rounding tie to the other side of it (the kernel divides once)
    mul = torch.where(amax > 0, torch.full_like(amax, E4M3_MAX) / amax.clamp(1e-30, 1e30), torch.ones_like(amax))
    return (x * mul).to(torch.float8_e4m3fn).float() / mul


def _slots(
    prefix_lens: list[int], q_len: int, page_size: int, spare_slots: int, layout: str, gen: Any
) -> tuple[Any, Any, int]:
    """(prefix slots -- flat, or a page table --, draft slots [B, Q], pool slots)."""
    import torch

    if page_size > 1:
        return _paged_slots(prefix_lens, q_len, page_size, spare_slots, layout, gen)
    B = len(prefix_lens)
    total = sum(prefix_lens) + B * q_len
    S = total + spare_slots
    if layout == "scattered":
        perm = torch.randperm(S, generator=gen)[:total].to(torch.int32)
    else:
        perm = torch.arange(total, dtype=torch.int32)
    prefix_indices = perm[: sum(prefix_lens)].clone()
    draft = perm[sum(prefix_lens) :].view(B, q_len).clone()
    return prefix_indices, draft, S


def _indptr(prefix_lens: list[int]) -> Any:
    """int32 [B+1]: the prefix lengths' running sum."""
    import torch

    indptr = torch.zeros(len(prefix_lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(prefix_lens, dtype=torch.int64), 0).to(torch.int32)
    return indptr


def _values(B: int, q_len: int, H: int, S: int, page_size: int, seed: int, device: str) -> tuple[Any, Any]:
    """(q [B, Q, H, 576], the KV pool) in bf16."""
    import torch

    # values are drawn on the target device: a batch of 32 long requests is gigabytes of KV
    dgen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, q_len, H, D_QK, generator=dgen, device=device).to(torch.bfloat16)
    kv = torch.randn(S, D_QK, generator=dgen, device=device).to(torch.bfloat16)
    if page_size > 1:
        kv = kv.view(S // page_size, page_size, D_QK)
    return q, kv


def _req_to_token(
    prefix_indices: Any, indptr: Any, prefix_lens: list[int], page_size: int, gen: Any
) -> tuple[Any, Any]:
    """(table, rows): each request's slots in a row of a [B + 5, longest + 7] table, rows shuffled."""
    import torch

    if page_size > 1:
        raise ValueError("req_to_token holds slots: page_size must be 1")
    B = len(prefix_lens)
    perm_rows = torch.randperm(B + 5, generator=gen)[:B].to(torch.int32)
    table = torch.full((B + 5, max(prefix_lens, default=0) + 7), -1, dtype=torch.int32)
    for b in range(B):
        lo, hi = int(indptr[b]), int(indptr[b + 1])
        table[perm_rows[b], : hi - lo] = prefix_indices[lo:hi]
    return table, perm_rows


def _split_q(q: Any, device: str) -> tuple[Any, Any]:
    """(q_nope, q_pe): q_nope in place inside a [B*Q, H, 640] buffer (as an absorbed q often is), q_pe apart."""
    import torch

    B, q_len, H, _ = q.shape
    wide = torch.zeros(B * q_len, H, D_QK + 64, dtype=torch.bfloat16, device=device)
    wide[..., :D_V] = q[..., :D_V].reshape(B * q_len, H, D_V)
    return wide[..., :D_V].view(B, q_len, H, D_V), q[..., D_V:].contiguous()


def _tree_masks(B: int, q_len: int, mask_dtype: str, gen: Any) -> Any:
    """[B, Q] random draft trees' rows, as int64 bit patterns or narrowed to `mask_dtype`."""
    import torch

    masks = [random_tree_mask(q_len, gen) for _ in range(B)]
    mask = torch.tensor([[m - (1 << 64) if m >= 1 << 63 else m for m in row] for row in masks], dtype=torch.int64)
    return mask if mask_dtype == "int64" else _narrow_mask(mask, mask_dtype)


def _paged_slots(
    prefix_lens: list[int], q_len: int, page_size: int, spare_slots: int, layout: str, gen: Any
) -> tuple[Any, Any, int]:
    """(page table [B, max_pages], draft slots [B, Q], pool slots) for a paged pool."""
    import torch

    need = [-(-(p + q_len) // page_size) for p in prefix_lens]
    pages = sum(need) + -(-spare_slots // page_size)
    order = torch.randperm(pages, generator=gen) if layout == "scattered" else torch.arange(pages)
    table = torch.zeros(len(prefix_lens), max(need), dtype=torch.int32)
    draft = torch.empty(len(prefix_lens), q_len, dtype=torch.int32)
    at = 0
    for b, (p, n) in enumerate(zip(prefix_lens, need)):
        table[b, :n] = order[at : at + n].to(torch.int32)
        at += n
        pos = torch.arange(p, p + q_len)
        draft[b] = (table[b, pos // page_size].long() * page_size + pos % page_size).to(torch.int32)
    return table, draft, pages * page_size


_UNSIGNED = {"uint16": "int16", "uint32": "int32", "uint64": "int64"}


def _narrow_mask(mask: Any, dtype: str) -> Any:
    """The int64 mask rows as `dtype` rows (their bits must fit)."""
    import torch

    bits = torch.iinfo(getattr(torch, _UNSIGNED.get(dtype, dtype))).bits
    if int(mask.max()) >> bits or int(mask.min()) < 0:
        raise ValueError(f"a mask row does not fit {dtype}")
    if dtype == "uint8":
        return mask.to(torch.uint8)
    signed = mask - ((mask >> (bits - 1)) & 1) * (1 << bits)  # the same bits as a signed value
    out = signed.to(getattr(torch, _UNSIGNED.get(dtype, dtype)))
    return out.view(getattr(torch, dtype)) if dtype in _UNSIGNED else out


def widen_mask(mask: Any) -> Any:
    """Mask rows of any width as int64 holding the same low bits."""
    import torch

    name = str(mask.dtype).removeprefix("torch.")
    if name in _UNSIGNED:
        mask = mask.view(getattr(torch, _UNSIGNED[name]))
    bits = torch.iinfo(mask.dtype).bits
    wide = mask.to(torch.int64)
    return wide if bits == 64 else wide & ((1 << bits) - 1)


def _visible(inp: Inputs, b: int) -> tuple[Any, Any]:
    """Slots request b attends to, and a [Q, P+Q] bool mask of which node sees which slot."""
    import torch

    lo, hi = int(inp.prefix_indptr[b]), int(inp.prefix_indptr[b + 1])
    Q = inp.q.shape[1]
    if inp.prefix_indices.dim() == 2:  # a table: request b's row, of slots or of page ids
        v = torch.arange(hi - lo, device=inp.q.device)
        ps = inp.page_size
        row = int(inp.prefix_rows[b]) if inp.prefix_rows is not None else b
        prefix = inp.prefix_indices[row, v // ps].long() * ps + v % ps
    else:
        prefix = inp.prefix_indices[lo:hi].long()
    slots = torch.cat([prefix, inp.draft_indices[b].long()])
    bits = torch.arange(Q, device=inp.q.device)
    m = widen_mask(inp.tree_mask[b]).view(Q, 1)
    tree = ((m >> bits.view(1, Q)) & 1).bool()
    visible = torch.cat([torch.ones(Q, hi - lo, dtype=torch.bool, device=inp.q.device), tree], dim=1)
    return slots, visible


def reference(inp: Inputs) -> tuple[Any, Any]:
    """fp32 attention exactly as specified: (o [B,Q,H,512] fp32, lse [B,Q,H] fp32, natural log), on
    the dequantized cache and, where the format's QK runs on e4m3, the per-row quantized q."""
    import torch

    B, Q, H, _ = inp.q.shape
    o = torch.empty(B, Q, H, D_V, dtype=torch.float32, device=inp.q.device)
    lse = torch.empty(B, Q, H, dtype=torch.float32, device=inp.q.device)
    q, kv = quantized_q(inp.full_q(), inp.kv_dtype), inp.dequantized_kv()
    for b in range(B):
        slots, visible = _visible(inp, b)
        k = kv[slots]  # [T, 576] fp32
        s = torch.einsum("qhd,td->qht", q[b], k) * inp.scale
        s = s.masked_fill(~visible.view(Q, 1, -1), float("-inf"))
        lse[b] = torch.logsumexp(s, dim=-1)
        o[b] = torch.einsum("qht,td->qhd", torch.softmax(s, dim=-1), k[:, :D_V])
    return o, lse


def score_inputs(
    *, batch: int, q_len: int, H: int, seed: int, kv_dtype: str, scale: float, device: str = "cuda"
) -> Inputs:
    """Inputs whose lse is a score: no prefix, and each draft node sees only itself, so the kernel's
    lse of a row is that row's one score (how its QK is checked on its own)."""
    import torch

    inp = make_inputs(
        prefix_lens=[0] * batch, q_len=q_len, H=H, device=device, seed=seed, spare_slots=91, kv_dtype=kv_dtype,
        scale=scale,
    )  # fmt: skip
    own = torch.tensor([[1 << i for i in range(q_len)]] * batch, device=device)
    return replace(inp, tree_mask=own)


def own_scores(inp: Inputs, q: Any) -> Any:
    """Each draft node's fp32 score against its own key [B, Q, H], for q as given ([B, Q, H, 576]):
    score_inputs' lse, computed on the dequantized cache."""
    import torch

    keys = inp.dequantized_kv()[inp.draft_indices.long()]  # [B, Q, 576]
    return torch.einsum("bqhd,bqd->bqh", q.float(), keys) * inp.scale


def poisoned_run_error(launch: Any, out: Any, ref: Any) -> float:
    """The correctness gate: fill `out` with NaN, run `launch()` once, wait, and return its
    relative error against `ref` (an element the kernel left unwritten makes it inf). The tuner's
    measurements, the tests and the benchmarks all gate through it."""
    import torch

    out.fill_(float("nan"))
    torch.cuda.synchronize()  # the poison lands before a launch on another stream reads `out`
    launch()
    torch.cuda.synchronize()
    return rel_error(out, ref)


def rel_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in fp32; NaN anywhere gives inf."""
    import torch

    diff = out.float() - ref.float()
    if not torch.isfinite(out.float()).all():
        return float("inf")
    return float(diff.norm() / ref.float().norm().clamp_min(1e-30))
