"""The verify kernel as a torch op, for inference engines: `torch.ops.verify_tuner.verify_attention`.

It runs on the device of its tensors (tensor-parallel rank k: cuda:k) and on that device's current
torch stream, so it is captured in the engine's own CUDA graphs; it checks dtypes, shapes, device
and contiguity with one clear error; its workspace comes from torch's allocator, sized by the
runtime plan for the batch (NSPLIT + B - 1 partial slots) and kept for later calls and replays.
It reads the engine's tensors in place: q as one 576-wide tensor or as q_nope + q_pe views at any
row strides, the KV pool with page size 1 (slots at kv_indptr) or in pages with a page table, and
the tree mask as uint64 rows or the uint8/16/32 rows SGLang packs.
The cubin comes from a bundle (`VERIFY_TUNER_CUBINS` or `use_bundle(path)`); without one it is
compiled when nvcc is present, and otherwise the call says what is missing. Neither PyCUDA nor
nvcc is needed on an inference host that has a bundle.

    import verify_tuner.engine.op  # registers the op
    torch.ops.verify_tuner.verify_attention(q, q_pe, kv, kv_indptr, kv_indices, kv_rows, draft_slots,
                                            tree_mask, out, lse, config_list(cfg), softmax_scale, None)
"""

# No `from __future__ import annotations`: torch.library reads the op's schema from live annotations.
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from verify_tuner.engine.bundle import Bundle, BundleError
from verify_tuner.kernels.abi import LaunchSpec, Layout, TensorMeta, call_layout, check_scale
from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.formats import DEFAULT as DEFAULT_KV_DTYPE
from verify_tuner.kernels.formats import kv_format
from verify_tuner.kernels.shapes import D_V, Q_BYTES
from verify_tuner.kernels.validate import validate

_lock = threading.Lock()
_bundle: Optional[Bundle] = None  # noqa: UP045
_kernels: dict[tuple[int, KernelConfig, int, int, str], Any] = {}  # device, config, q_len, H, kv_dtype
_workspace: dict[tuple[int, KernelConfig, int, int, int], torch.Tensor] = {}
_plans: dict[tuple, "_Plan"] = {}  # by _signature
_limits: dict[int, Any] = {}


def use_bundle(path: Optional[str]) -> None:  # noqa: UP045
    """Load cubins from this bundle folder (None: compile with nvcc instead)."""
    global _bundle
    with _lock:
        _bundle = Bundle.open(Path(path)) if path is not None else None
        _kernels.clear()
        _plans.clear()


def config_list(cfg: KernelConfig) -> list[int]:
    """The op's `config` argument: the constants in PARAM_NAMES order."""
    return [cfg.as_params()[n] for n in PARAM_NAMES]


def _cubin(cfg: KernelConfig, q_len: int, arch: str, kv_dtype: str) -> bytes:
    """Called under _lock (by _kernels_for), so it sets the bundle itself instead of use_bundle()."""
    global _bundle
    if _bundle is None and os.environ.get("VERIFY_TUNER_CUBINS"):
        _bundle = Bundle.open(Path(os.environ["VERIFY_TUNER_CUBINS"]))
    if _bundle is not None:
        return _bundle.cubin(cfg, q_len, arch, kv_dtype)
    from verify_tuner.kernels.build import compile_cubin, nvcc_path
    from verify_tuner.kernels.errors import CompileError

    try:
        nvcc_path()  # the compiler's own search (PATH, then $CUDA_HOME/bin), not a narrower one
    except CompileError as exc:
        raise BundleError(
            f"no cubin bundle (set VERIFY_TUNER_CUBINS to a `tuner configs dump --cubins` folder) and {exc}"
        ) from None

    folder = os.environ.get("TUNER_CACHE_DIR")
    if not folder:
        try:
            folder = str(Path.home() / ".cache" / "verify-tuner" / "cubins")
        except (RuntimeError, KeyError) as exc:  # a user with no home: the default is unknown, not a bug
            raise BundleError(
                f"no cubin bundle (set VERIFY_TUNER_CUBINS) and no TUNER_CACHE_DIR to compile into: {exc}"
            ) from None
    try:
        return compile_cubin(cfg, q_len, arch, Path(folder), kv_dtype=kv_dtype).cubin
    except PermissionError as exc:  # a cache another user filled: it may hold other configs, not this one
        raise BundleError(
            f"cannot compile {cfg} into {folder} ({exc.strerror}: {exc.filename}): set TUNER_CACHE_DIR to a folder "
            "this user can write, or VERIFY_TUNER_CUBINS to a bundle holding the config"
        ) from None


def _kernels_for(device: int, cfg: KernelConfig, q_len: int, H: int, kv_dtype: str = DEFAULT_KV_DTYPE) -> Any:
    from verify_tuner.kernels import runtime

    key = (device, cfg, q_len, H, kv_dtype)
    with _lock:
        if key not in _kernels:
            runtime.make_current(device)
            limits = _limits.setdefault(device, runtime.read_limits(device))
            validate(cfg, limits, H=H, q_len=q_len, kv_dtype=kv_dtype)
            spec = LaunchSpec(cfg, H, q_len, kv_dtype)
            cubin = _cubin(cfg, q_len, limits.arch, kv_dtype)
            _kernels[key] = runtime.CubinKernels(cubin, spec, sm_count=limits.sm_count)
        return _kernels[key]


def _check(
    tensors: dict[str, Optional[torch.Tensor]],  # noqa: UP045
    config: list[int],
    kv_dtype: str = DEFAULT_KV_DTYPE,
) -> tuple[KernelConfig, int, int, Layout]:
    if len(config) != len(PARAM_NAMES):
        raise InvalidConfig(f"config must list {len(PARAM_NAMES)} constants ({', '.join(PARAM_NAMES)})")
    cfg = KernelConfig.from_params(dict(zip(PARAM_NAMES, config)))
    q = tensors["q"]
    if q is None or q.dim() != 4:
        raise ValueError("verify_attention: q must be [B, q_len, H, 576] (or q_nope [B, q_len, H, 512] with q_pe)")
    _, q_len, H, _ = q.shape
    scale = tensors.get("kv_scale_tensor")
    if scale is not None and (scale.dtype != torch.float32 or scale.numel() != 1):
        raise ValueError(
            f"verify_attention: kv_scale_tensor must be one float32 (the layer's scale, e.g. a 0-d tensor), "
            f"got {str(scale.dtype).removeprefix('torch.')} {list(scale.shape)}"
        )
    try:
        metas = {k: TensorMeta.of(v) for k, v in tensors.items()}
        layout = call_layout(metas, q_len=q_len, H=H, kv_dtype=kv_format(kv_dtype).name)
    except (ValueError, InvalidConfig) as e:
        raise ValueError(f"verify_attention: {e}") from None
    return cfg, q_len, H, layout


def workspace_bytes(config: list[int], *, H: int, q_len: int, batch: int) -> int:
    """Bytes of the workspace a caller passes for one launch of `config` at (H, q_len, batch)."""
    cfg = KernelConfig.from_params(dict(zip(PARAM_NAMES, config)))
    return LaunchSpec(cfg, H, q_len).workspace_bytes(batch)


def shared_workspace_bytes(configs: dict[int, list[int]], *, H: int, q_len: int) -> int:
    """Bytes of one workspace that serves every batch size of `configs` (batch -> config list):
    an engine's steps and layers run one after another, so one buffer sized for the largest
    serves them all."""
    return max(workspace_bytes(cfg, H=H, q_len=q_len, batch=bs) for bs, cfg in configs.items())


@dataclass(frozen=True)
class _Plan:
    """What the calls of one signature launch (see _signature): checked and found at the first
    such call, then reused, so a call pays only for its addresses and the launch."""

    kernels: Any
    layout: Layout
    batch: int
    lse_offset: int  # bytes from the workspace's start to the partials' lse
    kept: Optional[torch.Tensor]  # noqa: UP045  # the op's own workspace when the caller passes None


def _signature(
    tensors: dict[str, Optional[torch.Tensor]],  # noqa: UP045
    config: list[int],
    workspace: Any,
    kv_dtype: str = DEFAULT_KV_DTYPE,
) -> tuple:
    """Everything the call's checks read: the config, the cache's format, and each tensor's dtype,
    shape, strides, device and 16-byte alignment (not its address)."""
    key: list[Any] = [tuple(config), kv_dtype]
    for t in (*tensors.values(), workspace):
        key.append(None if t is None else (t.dtype, t.shape, t.stride(), t.device, t.data_ptr() & 15))
    return tuple(key)


def _plan(
    tensors: dict[str, Optional[torch.Tensor]],  # noqa: UP045
    config: list[int],
    workspace: Optional[torch.Tensor],  # noqa: UP045
    kv_dtype: str = DEFAULT_KV_DTYPE,
) -> _Plan:
    """Check a call of a new signature; load its kernels and find its workspace: a caller's, or one
    the op keeps per (device, config, batch size), made here (before the engine captures its
    graph); launches sharing a workspace must be ordered, as one engine's verify steps are."""
    cfg, q_len, H, layout = _check(tensors, config, kv_dtype)
    q = tensors["q"]
    assert q is not None
    device, batch = q.device.index, q.shape[0]
    kernels = _kernels_for(device, cfg, q_len, H, kv_dtype)
    need, rows = kernels.spec.workspace_bytes(batch), kernels.spec.workspace_rows(batch)
    if workspace is None:
        with _lock:
            kept = _workspace.get((device, cfg, q_len, H, batch))
            if kept is None:
                kept = _workspace[(device, cfg, q_len, H, batch)] = torch.empty(
                    need, dtype=torch.uint8, device=q.device
                )
        return _Plan(kernels, layout, batch, rows * D_V * Q_BYTES, kept)
    ws = workspace
    if ws.dtype != torch.uint8 or ws.device != q.device or not ws.is_contiguous() or ws.numel() < need:
        raise ValueError(
            f"verify_attention: workspace must be a contiguous uint8 tensor of at least {need} bytes on "
            f"{q.device}, got {ws.dtype} [{ws.numel()}] on {ws.device}"
        )
    return _Plan(kernels, layout, batch, rows * D_V * Q_BYTES, None)


@torch.library.custom_op("verify_tuner::verify_attention", mutates_args=("out", "lse", "workspace"))
def verify_attention(
    q: torch.Tensor,
    q_pe: Optional[torch.Tensor],  # noqa: UP045
    kv: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_rows: Optional[torch.Tensor],  # noqa: UP045
    draft_slots: torch.Tensor,
    tree_mask: torch.Tensor,
    out: torch.Tensor,
    lse: Optional[torch.Tensor],  # noqa: UP045
    config: list[int],
    softmax_scale: float,
    workspace: Optional[torch.Tensor],  # noqa: UP045
    kv_dtype: str = "bf16",
    kv_scale: float = 1.0,
    kv_scale_tensor: Optional[torch.Tensor] = None,  # noqa: UP045
) -> None:
    """MLA verify attention into `out` (and `lse`).

    q [B,Q,H,576] bf16 with q_pe None, or q_nope [B,Q,H,512] + q_pe [B,Q,H,64] (last dim contiguous,
    (B, Q) mergeable, 16-byte aligned rows); kv [S,576] (or [pages, page_size, 576]) bf16;
    kv_indices int32: the prefixes' slots at kv_indptr (flat, page size 1), or a table with a row
    per request -- of slots (page size 1; SGLang's req_to_token, with kv_rows [B] int32 naming
    each request's row, read in place) or of page ids (a [B, max_pages] block table);
    kv_indptr [B+1] int32 prefix token offsets (the prefix lengths' running sum); draft_slots [B,Q] int32 slots; tree_mask [B,Q]
    rows of 8..64 bits (bit j of row i: node i sees node j); out [B,Q,H,512] bf16; lse [B,Q,H]
    fp32 or None; `config` from config_list(); workspace (always passed: torch counts a mutated
    argument by position) None (the op keeps one per batch size from
    torch's allocator) or a caller's uint8 buffer of at least workspace_bytes(config, ...) bytes on
    the same device, which launches sharing it must order. kv_dtype is the cache's format
    (verify_tuner.kernels.formats: bf16; fp8_e4m3, an e4m3 pool stored as uint8 or float8_e4m3fn
    whose values are stored * the layer's scale): the scale as kv_scale, or as kv_scale_tensor, one
    float32 on the device that a captured graph reads at every replay (a recalibrated scale);
    fp8_ds_mla, FlashMLA's rows of 656 bytes (kv [S, 656] or [pages, page_size, 656], uint8 or
    float8_e4m3fn), which carry their own scales and take no kv_scale (withheld while its GPU tests
    fail: refused with the reason, kernels/formats.py)."""
    tensors = {
        "q": q,
        "q_pe": q_pe,
        "kv": kv,
        "kv_indptr": kv_indptr,
        "kv_indices": kv_indices,
        "kv_rows": kv_rows,
        "draft_slots": draft_slots,
        "tree_mask": tree_mask,
        "out": out,
        "lse": lse,
        "kv_scale_tensor": kv_scale_tensor,
    }
    try:
        check_scale(kv_dtype, kv_scale, kv_scale_tensor is not None)
    except (ValueError, InvalidConfig) as e:
        raise ValueError(f"verify_attention: {e}") from None
    _launch(tensors, config, softmax_scale, workspace, kv_dtype, kv_scale)


def _pointers(t: dict[str, Optional[torch.Tensor]]) -> dict[str, Optional[int]]:  # noqa: UP045
    """The launch's device addresses of the op's tensors (no q_pe: None; no kv_rows or lse: 0)."""

    def at(name: str, absent: Optional[int] = 0) -> Optional[int]:  # noqa: UP045
        x = t[name]
        return x.data_ptr() if x is not None else absent

    return {
        "q": at("q"),
        "q_pe": at("q_pe", None),
        "kv": at("kv"),
        "prefix_indices": at("kv_indices"),
        "prefix_rows": at("kv_rows"),
        "prefix_indptr": at("kv_indptr"),
        "draft_indices": at("draft_slots"),
        "tree_mask": at("tree_mask"),
        "out": at("out"),
        "lse": at("lse"),
        "kv_scale_ptr": at("kv_scale_tensor"),
    }


def _launch(
    tensors: dict[str, Optional[torch.Tensor]],  # noqa: UP045
    config: list[int],
    softmax_scale: float,
    workspace: Optional[torch.Tensor],  # noqa: UP045
    kv_dtype: str = DEFAULT_KV_DTYPE,
    kv_scale: float = 1.0,
) -> None:
    """The op's work: the signature's plan, the call's addresses, a launch on the current stream."""
    key = _signature(tensors, config, workspace, kv_dtype)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.setdefault(key, _plan(tensors, config, workspace, kv_dtype))
    base = (workspace if workspace is not None else plan.kept).data_ptr()  # type: ignore[union-attr]
    q = tensors["q"]
    assert q is not None
    plan.kernels.launch(
        stream=torch.cuda.current_stream(q.device).cuda_stream,
        batch=plan.batch,
        pointers=_pointers(tensors),
        part_o=base,
        part_lse=base + plan.lse_offset,
        softmax_scale=softmax_scale,
        layout=plan.layout,
        kv_scale=kv_scale,
    )


@verify_attention.register_fake
def _(
    q: torch.Tensor,
    q_pe: Optional[torch.Tensor],  # noqa: UP045
    kv: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_rows: Optional[torch.Tensor],  # noqa: UP045
    draft_slots: torch.Tensor,
    tree_mask: torch.Tensor,
    out: torch.Tensor,
    lse: Optional[torch.Tensor],  # noqa: UP045
    config: list[int],
    softmax_scale: float,
    workspace: Optional[torch.Tensor],  # noqa: UP045
    kv_dtype: str = "bf16",
    kv_scale: float = 1.0,
    kv_scale_tensor: Optional[torch.Tensor] = None,  # noqa: UP045
) -> None:
    """The op returns nothing and writes only its arguments: tracing needs no shapes from it."""
