"""Inputs, the fp32 torch reference and the poisoned-output check (torch imported lazily).

The reference is the definition of the function: every correctness check (tests, the tuner's
gate) compares against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verify_tuner.kernels.shapes import D_QK, D_V


@dataclass
class Inputs:
    q: Any  # [B, Q, H, 576] bf16
    kv: Any  # [S, 576] bf16
    prefix_indices: Any  # int32 [sum P]
    prefix_indptr: Any  # int32 [B+1]
    draft_indices: Any  # int32 [B, Q]
    tree_mask: Any  # int64 (bit pattern of uint64) [B, Q]
    scale: float

    @property
    def batch(self) -> int:
        return int(self.q.shape[0])


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
) -> Inputs:
    """Random inputs. Slots are a random permutation of the pool ("scattered", a fragmented
    page-size-1 cache: the worst case for the memory system) or consecutive ("contiguous": each
    request's prefix, then the draft slots, in pool order)."""
    import torch

    if layout not in SLOT_LAYOUTS:
        raise ValueError(f"layout must be one of {SLOT_LAYOUTS}, got {layout!r}")
    gen = torch.Generator().manual_seed(seed)
    B = len(prefix_lens)
    total = sum(prefix_lens) + B * q_len
    S = total + spare_slots
    if layout == "scattered":
        perm = torch.randperm(S, generator=gen)[:total].to(torch.int32)
    else:
        perm = torch.arange(total, dtype=torch.int32)
    prefix_indices = perm[: sum(prefix_lens)].clone()
    draft = perm[sum(prefix_lens) :].view(B, q_len).clone()
    indptr = torch.zeros(B + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(prefix_lens, dtype=torch.int64), 0).to(torch.int32)
    # values are drawn on the target device: a batch of 32 long requests is gigabytes of KV
    dgen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, q_len, H, D_QK, generator=dgen, device=device).to(torch.bfloat16)
    kv = torch.randn(S, D_QK, generator=dgen, device=device).to(torch.bfloat16)
    masks = [random_tree_mask(q_len, gen) for _ in range(B)]
    mask = torch.tensor([[m - (1 << 64) if m >= 1 << 63 else m for m in row] for row in masks], dtype=torch.int64)
    return Inputs(
        q=q.to(device),
        kv=kv.to(device),
        prefix_indices=prefix_indices.to(device),
        prefix_indptr=indptr.to(device),
        draft_indices=draft.to(device),
        tree_mask=mask.to(device),
        scale=scale if scale is not None else D_QK**-0.5,
    )


def _visible(inp: Inputs, b: int) -> tuple[Any, Any]:
    """Slots request b attends to, and a [Q, P+Q] bool mask of which node sees which slot."""
    import torch

    lo, hi = int(inp.prefix_indptr[b]), int(inp.prefix_indptr[b + 1])
    Q = inp.q.shape[1]
    slots = torch.cat([inp.prefix_indices[lo:hi].long(), inp.draft_indices[b].long()])
    bits = torch.arange(Q, device=inp.q.device)
    m = inp.tree_mask[b].view(Q, 1)
    tree = ((m >> bits.view(1, Q)) & 1).bool()
    visible = torch.cat([torch.ones(Q, hi - lo, dtype=torch.bool, device=inp.q.device), tree], dim=1)
    return slots, visible


def reference(inp: Inputs) -> tuple[Any, Any]:
    """fp32 attention exactly as specified: (o [B,Q,H,512] fp32, lse [B,Q,H] fp32, natural log)."""
    import torch

    B, Q, H, _ = inp.q.shape
    o = torch.empty(B, Q, H, D_V, dtype=torch.float32, device=inp.q.device)
    lse = torch.empty(B, Q, H, dtype=torch.float32, device=inp.q.device)
    for b in range(B):
        slots, visible = _visible(inp, b)
        k = inp.kv[slots].float()  # [T, 576]
        s = torch.einsum("qhd,td->qht", inp.q[b].float(), k) * inp.scale
        s = s.masked_fill(~visible.view(Q, 1, -1), float("-inf"))
        lse[b] = torch.logsumexp(s, dim=-1)
        o[b] = torch.einsum("qht,td->qhd", torch.softmax(s, dim=-1), k[:, :D_V])
    return o, lse


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
