"""The kernels' launch contract, shared by every loader: grids, argument order, workspace size and
the checks of a call's tensors. The tuner's PyCUDA launcher (kernels/launch.py) and the engine's
cuda-python launcher (kernels/runtime.py) both build their launches here, so the tuner times
exactly what an engine runs. Pure Python: no torch, no CUDA.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.plan import workspace_slots
from verify_tuner.kernels.shapes import D_QK, D_V

LOG2E = 1.4426950408889634
#: The kernels' arguments in PyCUDA's prepare() letters (csrc/verify_attention.cu's signatures).
PARTIAL_ARGS = "PPPPPPPPPPiif"
REDUCE_ARGS = "PPPPPiii"


def reduce_grid(*, batch: int, q_len: int, H: int, sm_count: int, threads: int) -> tuple[int, int]:
    """(blocks, items per block) of the reduce: an item is one (row, quarter) of a request's output,
    4 * q_len * H a request. Enough blocks for two requests' items (all of a long request's merges
    run in parallel) and four per SM, but no more: past the GPU's block-launch rate, blocks for
    requests that one part wrote whole cost more than the merges (a block checks up to `threads`
    items at once)."""
    items = batch * q_len * H * 4
    blocks = min(items, max(2 * q_len * H * 4, 4 * sm_count, -(-items // threads)))
    return blocks, -(-items // blocks)


@dataclass(frozen=True)
class LaunchSpec:
    """One compiled config at (H, q_len): what a launch of it looks like for a batch."""

    cfg: KernelConfig
    H: int
    q_len: int

    def partial_grid(self) -> tuple[int, int, int]:
        """The same for every batch: the kernel plans each batch's share of its parts."""
        row_tiles = -(-self.q_len // self.cfg.row_tile(self.q_len))
        return (self.cfg.nsplit, self.H // self.cfg.ht * row_tiles, 1)

    def workspace_rows(self, batch: int) -> int:
        """Rows of 512 bf16 (plus one fp32 lse each) the partials of a batch can need."""
        return workspace_slots(nsplit=self.cfg.nsplit, batch=batch) * self.q_len * self.H

    def partial_args(
        self,
        *,
        q: int,
        kv: int,
        prefix_indices: int,
        prefix_indptr: int,
        draft_indices: int,
        tree_mask: int,
        part_o: int,
        part_lse: int,
        out: int,
        lse: int,
        batch: int,
        softmax_scale: float,
    ) -> tuple[float, ...]:
        return (
            q,
            kv,
            prefix_indices,
            prefix_indptr,
            draft_indices,
            tree_mask,
            part_o,
            part_lse,
            out,
            lse,
            batch,
            self.H,
            softmax_scale * LOG2E,
        )

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


def check_call(t: Mapping[str, TensorMeta | None], *, q_len: int, H: int) -> str | None:
    """The first reason the op's tensors cannot be launched, naming the tensor, or None."""
    need = {
        "q": ("bfloat16", None),
        "kv": ("bfloat16", None),
        "kv_indptr": ("int32", None),
        "kv_indices": ("int32", None),
        "draft_slots": ("int32", None),
        "tree_mask": ("int64", None),
        "out": ("bfloat16", None),
    }
    for name, (dtype, _) in need.items():
        m = t.get(name)
        if m is None:
            return f"{name} is required"
        if m.dtype != dtype:
            return f"{name} must be {dtype}, got {m.dtype}"
    q = t["q"]
    if len(q.shape) != 4 or q.shape[1:] != (q_len, H, D_QK):
        return f"q must be [B, {q_len}, {H}, {D_QK}] for this op's q_len and H, got {list(q.shape)}"
    B = q.shape[0]
    want = {
        "kv": (None, D_QK),
        "kv_indptr": (B + 1,),
        "draft_slots": (B, q_len),
        "tree_mask": (B, q_len),
        "out": (B, q_len, H, D_V),
        "kv_indices": (None,),
    }
    lse = t.get("lse")
    if lse is not None:
        if lse.dtype != "float32":
            return f"lse must be float32, got {lse.dtype}"
        want["lse"] = (B, q_len, H)
    for name, shape in want.items():
        got = t[name].shape  # type: ignore[union-attr]
        if len(got) != len(shape) or any(w is not None and w != g for w, g in zip(shape, got)):
            spelled = ", ".join("*" if w is None else str(w) for w in shape)
            return f"{name} must be [{spelled}] for a batch of {B}, got {list(got)}"
    for name, m in t.items():
        if m is None:
            continue
        if m.device != q.device:
            return f"{name} is on {m.device}, q on {q.device}: every tensor must be on one CUDA device"
        if not m.contiguous:
            return f"{name} must be contiguous"
    if not q.device.startswith("cuda"):
        return f"the tensors are on {q.device}: the kernel runs on a CUDA device"
    return None
