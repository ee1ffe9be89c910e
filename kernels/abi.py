"""The kernels' launch contract, shared by every loader: grids, argument order, workspace size and
the checks of a call's tensors. The tuner's PyCUDA launcher (kernels/launch.py) and the engine's
cuda-python launcher (kernels/runtime.py) both build their launches here, so the tuner times
exactly what an engine runs. Pure Python: no torch, no CUDA.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.formats import KVFormat, kv_format
from verify_tuner.kernels.plan import workspace_slots
from verify_tuner.kernels.shapes import D_QK, D_V, Q_BYTES, Q_DTYPE

LOG2E = 1.4426950408889634
#: The kernels' arguments in PyCUDA's prepare() letters (csrc/verify_attention.cu's signatures).
PARTIAL_ARGS = "PPPPPPPPPPPPiiiiiiiiifPf"
REDUCE_ARGS = "PPPPPiii"
#: Tree-mask row widths the kernel reads, by dtype (SGLang packs q_len <= 8/16/32 into uint8/16/32).
MASK_BYTES = {"uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8}
_I32 = 2**31 - 1


@dataclass(frozen=True)
class Layout:
    """How a call's tensors lie in memory, as the partial kernel's integer arguments (elements):
    the token and head strides of q's first 512 dims and of its 64 rope dims; the prefix's index
    form: page_stride 0 for flat slots at kv_indptr, else a table whose rows are `page_stride`
    apart (one per request, or the row kv_rows names) of slots (page_shift 0) or of pages of
    2^page_shift slots; and the tree mask's row width in bytes."""

    q_st: int
    q_sh: int
    pe_st: int
    pe_sh: int
    page_shift: int = 0
    page_stride: int = 0
    mask_bytes: int = 8

    @classmethod
    def dense(cls, H: int) -> Layout:
        """One contiguous [B, Q, H, 576] q, page-size-1 slots, uint64 mask rows."""
        return cls(q_st=H * D_QK, q_sh=D_QK, pe_st=H * D_QK, pe_sh=D_QK)


def reduce_grid(
    *, batch: int, q_len: int, H: int, sm_count: int, threads: int, max_pieces: int = 4
) -> tuple[int, int, int]:
    """(blocks, items per block, pieces a row) of the reduce: an item is one (row, piece) of a
    request's output, a piece 512 / pieces dims. A request of few rows (q_len * H * 4 under the SM
    count: H=8 q=1 merged on 32 of 132 SMs) cuts its rows into 16 pieces where the cubin has that
    kernel (kReduceMaxPieces 16: verify_attn_reduce16), else 4 (verify_attn_reduce). Enough blocks
    for two requests' items (all of a long request's merges run in parallel) and four per SM, but
    no more: past the GPU's block-launch rate, blocks for requests that one part wrote whole cost
    more than the merges (a block checks up to `threads` items at once)."""
    pieces = 16 if max_pieces >= 16 and q_len * H * 4 < sm_count else 4
    items = batch * q_len * H * pieces
    blocks = min(items, max(2 * q_len * H * pieces, 4 * sm_count, -(-items // threads)))
    return blocks, -(-items // blocks), pieces


@dataclass(frozen=True)
class LaunchSpec:
    """One compiled config at (H, q_len): what a launch of it looks like for a batch."""

    cfg: KernelConfig
    H: int
    q_len: int
    kv_dtype: str = "bf16"

    def partial_grid(self) -> tuple[int, int, int]:
        """The same for every batch: the kernel plans each batch's share of its parts."""
        row_tiles = -(-self.q_len // self.cfg.row_tile(self.q_len))
        return (self.cfg.nsplit, self.H // self.cfg.ht * row_tiles, 1)

    def workspace_bytes(self, batch: int) -> int:
        """Bytes of a caller's workspace for a batch: the partials (bf16 rows of 512), then their lse."""
        return self.workspace_rows(batch) * (D_V * Q_BYTES + 4)

    def workspace_rows(self, batch: int) -> int:
        """Rows of 512 bf16 (plus one fp32 lse each) the partials of a batch can need."""
        return workspace_slots(nsplit=self.cfg.nsplit, batch=batch) * self.q_len * self.H

    def partial_args(
        self,
        *,
        q: int,
        q_pe: int | None = None,
        kv: int,
        prefix_indices: int,
        prefix_rows: int | None = None,
        prefix_indptr: int,
        draft_indices: int,
        tree_mask: int,
        part_o: int,
        part_lse: int,
        out: int,
        lse: int,
        batch: int,
        softmax_scale: float,
        layout: Layout | None = None,
        kv_scale: float = 1.0,
        kv_scale_ptr: int = 0,
    ) -> tuple[float, ...]:
        """The partial's arguments; q_pe None means q holds 576-wide rows (its dims 512.. are the rope
        part), layout None the dense layout (Layout.dense). A scaled format's kernel reads the layer's
        scale at kv_scale_ptr (a device float, so a captured graph follows a recalibrated scale) or,
        with 0 there, takes kv_scale; a bf16 kernel ignores both."""
        lay = layout if layout is not None else Layout.dense(self.H)
        pointers = (q, q_pe if q_pe is not None else q + D_V * Q_BYTES, kv, prefix_indices, prefix_rows or 0,
                    prefix_indptr, draft_indices, tree_mask, part_o, part_lse, out, lse)  # fmt: skip
        sizes = (batch, self.H, lay.q_st, lay.q_sh, lay.pe_st, lay.pe_sh, lay.page_shift, lay.page_stride,
                 lay.mask_bytes)  # fmt: skip
        return (*pointers, *sizes, softmax_scale * LOG2E, kv_scale_ptr, kv_scale)

    def reduce_args(
        self, *, part_o: int, part_lse: int, prefix_indptr: int, out: int, lse: int, batch: int, per_block: int
    ) -> tuple[int, ...]:
        return (part_o, part_lse, prefix_indptr, out, lse, batch, self.H, per_block)


@dataclass(frozen=True)
class TensorMeta:
    """What the call checks of one tensor (torch-free, so the checks are tested without a GPU)."""

    dtype: str  # "bfloat16", "int32", "int64", "float32"
    shape: tuple[int, ...]
    device: str  # "cuda:0"
    contiguous: bool
    strides: tuple[int, ...] = ()  # in elements; () means the contiguous ones
    address: int = 0  # data_ptr(), for the 16-byte alignment the kernel's copies need

    @classmethod
    def of(cls, t: Any) -> TensorMeta | None:
        """The meta of a torch tensor (duck-typed: this module imports no torch), or None."""
        if t is None:
            return None
        return cls(
            str(t.dtype).removeprefix("torch."),
            tuple(t.shape),
            str(t.device),
            bool(t.is_contiguous()),
            tuple(t.stride()),
            int(t.data_ptr()),
        )

    def stride(self, dim: int) -> int:
        if self.strides:
            return self.strides[dim]
        n = 1
        for d in self.shape[dim + 1 :]:
            n *= d
        return n


def _shape_error(name: str, m: TensorMeta, shape: tuple[int | None, ...], what: str) -> str | None:
    got = m.shape
    if len(got) != len(shape) or any(w is not None and w != g for w, g in zip(shape, got)):
        spelled = ", ".join("*" if w is None else str(w) for w in shape)
        return f"{name} must be [{spelled}] {what}, got {list(got)}"
    return None


def _row_strides(name: str, m: TensorMeta) -> tuple[int, int] | str:
    """(token stride, head stride) of a [B, Q, H, D] q part whose (B, Q) dims merge into one token
    index, or why they cannot be read in place."""
    B, Q, H, _ = m.shape
    s0, s1, s2, s3 = (m.stride(d) for d in range(4))
    if s3 != 1:
        return f"{name}'s last dimension must be contiguous (stride 1), got {s3}"
    if B > 1 and Q > 1 and s0 != Q * s1:
        return f"{name}'s batch and q_len dimensions must merge (stride[0] == q_len * stride[1]), got {m.strides}"
    st = s1 if Q > 1 else s0
    sh = s2 if H > 1 else 0
    if st % 8 or sh % 8 or m.address % 16:
        return f"{name} must be 16-byte aligned with strides that are multiples of 8 elements, got {m.strides}"
    # The kernel forms each row's offset in 64 bits (tok * q_st + head * q_sh) from int stride
    # arguments, so only the strides themselves must fit: a head-major q of any token count passes.
    if max(st, sh) > _I32:
        return f"{name}'s strides {m.strides} do not fit the kernel's 32-bit stride arguments"
    return st, sh


def _q_layout(t: Mapping[str, TensorMeta | None], q_len: int, H: int) -> tuple[int, int, int, int] | str:
    q, pe = t["q"], t.get("q_pe")
    assert q is not None
    if pe is None:
        err = _shape_error("q", q, (None, q_len, H, D_QK), f"(or [B, {q_len}, {H}, {D_V}] with q_pe)")
        if err:
            return err
        got = _row_strides("q", q)
        return got if isinstance(got, str) else (*got, *got)
    err = _shape_error("q", q, (None, q_len, H, D_V), "when q_pe is given (q_nope)")
    if err:
        return err
    if pe.dtype != Q_DTYPE:
        return f"q_pe must be {Q_DTYPE}, got {pe.dtype}"
    err = _shape_error("q_pe", pe, (q.shape[0], q_len, H, D_QK - D_V), "")
    if err:
        return err
    a, b = _row_strides("q", q), _row_strides("q_pe", pe)
    for got in (a, b):
        if isinstance(got, str):
            return got
    return (*a, *b)


def _kv_layout(
    kv: TensorMeta, idx: TensorMeta, rows: TensorMeta | None, B: int, fmt: KVFormat
) -> tuple[int, int] | str:
    """(page_shift, page_stride) from the pool's and the indices' shapes. kv is [S, W] or
    [pages, page_size, W], W the format's row in the pool's elements (576 for bf16 and e4m3);
    kv_indices is flat (the prefixes' slots at kv_indptr, page size 1) or a table: a row per request
    of slots (page size 1: SGLang's req_to_token, whose rows kv_rows picks) or of page ids (a block
    table)."""
    w = fmt.pool_row_elems(kv.dtype)
    if len(kv.shape) == 2:
        err = _shape_error("kv", kv, (None, w), f"(or [pages, page_size, {w}]) for {fmt.name}")
        ps = 1
    else:
        err = _shape_error("kv", kv, (None, None, w), f"(pages, page_size, {w}) for {fmt.name}")
        ps = kv.shape[1] if len(kv.shape) == 3 else 0
    if err:
        return err
    if ps < 1 or ps & (ps - 1):
        return f"kv's page size must be a power of two, got {ps}"
    if len(idx.shape) == 1:
        if ps > 1:
            return f"kv_indices must be a table [B, max_pages] of page ids for page size {ps}, got {list(idx.shape)}"
        if rows is not None:
            return "kv_rows picks rows of a table: kv_indices must be 2-d with it"
        return (0, 0) if idx.stride(0) == 1 else "kv_indices must be contiguous"
    if len(idx.shape) != 2:
        return f"kv_indices must be flat slots or a 2-d table, got {list(idx.shape)}"
    if rows is None and idx.shape[0] != B:
        return f"kv_indices must be [{B}, *] (a row per request) without kv_rows, got {list(idx.shape)}"
    if rows is not None and (rows.dtype != "int32" or rows.shape != (B,)):
        return f"kv_rows must be int32 [{B}] (each request's row of kv_indices), got {rows.dtype} {list(rows.shape)}"
    if idx.stride(1) != 1:
        return "kv_indices' rows must be contiguous"
    if idx.stride(0) * max(idx.shape[0], 1) > _I32:
        return "kv_indices is too large for 32-bit offsets"
    return ps.bit_length() - 1, idx.stride(0)


def check_call(t: Mapping[str, TensorMeta | None], *, q_len: int, H: int, kv_dtype: str = "bf16") -> str | None:
    """The first reason the op's tensors cannot be launched, naming the tensor, or None."""
    got = _layout(t, q_len=q_len, H=H, fmt=kv_format(kv_dtype))
    return got if isinstance(got, str) else None


def call_layout(
    t: Mapping[str, TensorMeta | None], *, q_len: int, H: int, on_cuda: bool = True, kv_dtype: str = "bf16"
) -> Layout:
    """The call's Layout; a ValueError names the first tensor that cannot be launched and why.
    on_cuda=False lays out tensors held elsewhere (the reference's inputs on the CPU)."""
    got = _layout(t, q_len=q_len, H=H, fmt=kv_format(kv_dtype), on_cuda=on_cuda)
    if isinstance(got, Layout):
        return got
    raise ValueError(got)


def check_scale(kv_dtype: str, kv_scale: float, has_tensor: bool) -> None:
    """A ValueError for a layer scale given to a format that has none (its kernel would ignore it)."""
    fmt = kv_format(kv_dtype)
    if fmt.scale != "per_layer" and (kv_scale != 1.0 or has_tensor):
        got = "kv_scale_tensor" if has_tensor else f"kv_scale={kv_scale}"
        if fmt.scale == "none":
            raise ValueError(
                f"kv_dtype {kv_dtype} is read as stored and takes no kv_scale "
                f"(got {got}): scale the softmax and the output instead"
            )
        raise ValueError(f"kv_dtype {kv_dtype}'s rows carry their own scales and take no kv_scale (got {got})")


def _layout(
    t: Mapping[str, TensorMeta | None], *, q_len: int, H: int, fmt: KVFormat, on_cuda: bool = True
) -> Layout | str:
    err = _dtype_error(t, q_len, fmt)
    if err:
        return err
    mask = t["tree_mask"]
    assert mask is not None
    q = t["q"]
    assert q is not None
    if len(q.shape) != 4:
        return f"q must be [B, {q_len}, {H}, {D_QK}] (or q_nope [B, {q_len}, {H}, {D_V}] + q_pe), got {list(q.shape)}"
    strides = _q_layout(t, q_len, H)
    if isinstance(strides, str):
        return strides
    B = q.shape[0]
    pages = _kv_layout(t["kv"], t["kv_indices"], t.get("kv_rows"), B, fmt)  # type: ignore[arg-type]
    if isinstance(pages, str):
        return pages
    want: dict[str, tuple[int | None, ...]] = {
        "kv_indptr": (B + 1,),
        "draft_slots": (B, q_len),
        "tree_mask": (B, q_len),
        "out": (B, q_len, H, D_V),
    }
    lse = t.get("lse")
    if lse is not None:
        if lse.dtype != "float32":
            return f"lse must be float32, got {lse.dtype}"
        want["lse"] = (B, q_len, H)
    for name, shape in want.items():
        err = _shape_error(name, t[name], shape, f"for a batch of {B}")  # type: ignore[arg-type]
        if err:
            return err
    err = _placement_error(t, q.device, on_cuda)
    if err:
        return err
    q_st, q_sh, pe_st, pe_sh = strides
    return Layout(q_st, q_sh, pe_st, pe_sh, pages[0], pages[1], MASK_BYTES[mask.dtype])


def _dtype_error(t: Mapping[str, TensorMeta | None], q_len: int, fmt: KVFormat) -> str | None:
    """Why a required tensor is missing or of the wrong dtype (the tree mask's: too few bits), or None."""
    need = {
        "q": (Q_DTYPE,),
        "kv": fmt.pool_dtypes,
        "kv_indptr": ("int32",),
        "kv_indices": ("int32",),
        "draft_slots": ("int32",),
        "out": (Q_DTYPE,),
    }
    for name, dtypes in need.items():
        m = t.get(name)
        if m is None:
            return f"{name} is required"
        if m.dtype not in dtypes:
            what = f" for kv_dtype {fmt.name}" if name == "kv" else ""
            return f"{name} must be {' or '.join(dtypes)}{what}, got {m.dtype}"
    mask = t.get("tree_mask")
    if mask is None:
        return "tree_mask is required"
    if mask.dtype not in MASK_BYTES:
        return f"tree_mask must be an integer type of 8..64 bits ({', '.join(MASK_BYTES)}), got {mask.dtype}"
    if MASK_BYTES[mask.dtype] * 8 < q_len:
        return f"tree_mask's {mask.dtype} rows hold {MASK_BYTES[mask.dtype] * 8} bits, q_len is {q_len}"
    return None


def _placement_error(t: Mapping[str, TensorMeta | None], device: str, on_cuda: bool) -> str | None:
    """Why a tensor is off q's device or not contiguous where it must be, or the call not on CUDA; or None."""
    in_place = {"q", "q_pe", "kv_indices"}  # read through their strides
    for name, m in t.items():
        if m is None:
            continue
        if m.device != device:
            return f"{name} is on {m.device}, q on {device}: every tensor must be on one CUDA device"
        if name not in in_place and not m.contiguous:
            return f"{name} must be contiguous"
    if on_cuda and not device.startswith("cuda"):
        return f"the tensors are on {device}: the kernel runs on a CUDA device"
    return None
