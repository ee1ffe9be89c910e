"""SGLang's target-verify tree masks as the kernel's mask rows: on the device, in static shapes, with
no host sync, so the conversion is captured in the engine's CUDA graph and replays every step.

SGLang 0.5.23 writes the verify mask in one of three layouts (`TreeMaskMode`, built by its tree
kernel `build_tree_kernel_efficient`); in each, draft node i of request b sees node j (its
ancestors, itself and the root, node 0) and every prefix token:
- FULL_MASK (the GPU default): bool or uint8 cells, request after request, request b a row-major
  [q_len, seq_len_b + q_len] block starting at q_len * sum(seq_lens[:b]) + q_len^2 * b; row i is
  node i, column c < seq_len_b a prefix token, column seq_len_b + j node j.
- QLEN_ONLY: the draft columns alone, [bs, q_len, q_len] cells.
- QLEN_ONLY_BITPACKING: [bs * q_len] rows of uint8/16/32 (q_len <= 8/16/32), bit j of row i.
A chain (DFlash's verify, whose custom_mask is None) sees nodes 0..i.
The kernel reads [bs, q_len] rows of up to 64 bits (bit j of row i); this module writes int64 rows.
"""

from __future__ import annotations

from enum import IntEnum

import torch
from verify_tuner.kernels.validate import MAX_Q_LEN


class TreeMaskMode(IntEnum):
    """SGLang's `TreeMaskMode` values (sglang.kernels.ops.speculative.spec_tree)."""

    FULL_MASK = 0
    QLEN_ONLY = 1
    QLEN_ONLY_BITPACKING = 2


#: The packed row type SGLang allocates for a q_len (QLEN_ONLY_BITPACKING holds at most 32 nodes).
PACKED_DTYPES = ((8, torch.uint8), (16, torch.uint16), (32, torch.uint32))
_SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32}


def packed_dtype(q_len: int) -> torch.dtype:
    """SGLang's row type for QLEN_ONLY_BITPACKING at this q_len."""
    for bits, dtype in PACKED_DTYPES:
        if q_len <= bits:
            return dtype
    raise ValueError(f"QLEN_ONLY_BITPACKING holds at most 32 draft tokens, got q_len {q_len}")


def mask_numel(mode: TreeMaskMode, *, bs: int, q_len: int, max_context_len: int) -> int:
    """Cells (rows, packed) a mask buffer for `bs` requests holds in `mode`."""
    if mode == TreeMaskMode.FULL_MASK:
        return bs * q_len * (max_context_len + q_len)
    if mode == TreeMaskMode.QLEN_ONLY:
        return bs * q_len * q_len
    return bs * q_len


class MaskPacker:
    """Turns a batch's mask (any mode, or a chain) into int64 rows, for batches up to `max_bs`.
    Its index tensors are made once, so a call allocates only its temporaries and launches a few
    small kernels: nothing reads back to the host."""

    def __init__(self, *, q_len: int, max_bs: int, device: torch.device | str) -> None:
        if not 1 <= q_len <= MAX_Q_LEN:
            raise ValueError(f"q_len must be in 1..{MAX_Q_LEN} (a uint64 tree-mask row), got {q_len}")
        self.q_len, self.max_bs = q_len, max_bs
        node = torch.arange(q_len, dtype=torch.int64, device=device)
        self.bits = torch.ones(q_len, dtype=torch.int64, device=device) << node  # 1 << 63 wraps to int64's sign bit
        self.node = node
        self.req = torch.arange(max_bs, dtype=torch.int64, device=device)
        self.chain_rows = torch.cumsum(self.bits, 0).expand(max_bs, q_len).contiguous()  # node i: bits 0..i

    def pack(
        self,
        mask: torch.Tensor | None,
        mode: TreeMaskMode,
        *,
        bs: int,
        out: torch.Tensor,
        seq_lens: torch.Tensor | None = None,
    ) -> None:
        """Write the rows of a batch of `bs` into out[:bs] (int64 [>= bs, q_len]). mask None is a
        chain; FULL_MASK needs the batch's prefix lengths `seq_lens` (without the draft tokens).
        Requests past the mask's end are padding (SGLang's DP attention pads an eager batch by whole
        requests and leaves the mask as the draft wrote it): they get chain rows, and their
        outputs are dropped."""
        q = self.q_len
        if mask is None or mask.numel() == 0:
            out[:bs].copy_(self.chain_rows[:bs])
            return
        if mode == TreeMaskMode.FULL_MASK:
            cells, inside = self._full_cells(mask, bs, seq_lens)
            torch.sum((cells != 0).to(torch.int64) * self.bits, dim=-1, out=out[:bs])
            torch.where(inside.view(bs, 1), out[:bs], self.chain_rows[:bs], out=out[:bs])
            return
        if mode == TreeMaskMode.QLEN_ONLY_BITPACKING:
            n = min(bs, mask.numel() // q)
            out[:n].copy_(self._widen(mask[: n * q]).view(n, q))
        else:
            n = min(bs, mask.numel() // (q * q))
            cells = mask[: n * q * q].view(n, q, q)
            torch.sum((cells != 0).to(torch.int64) * self.bits, dim=-1, out=out[:n])
        out[n:bs].copy_(self.chain_rows[n:bs])

    def _full_cells(
        self, mask: torch.Tensor, bs: int, seq_lens: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft columns of each request's [q_len, seq_len + q_len] block, gathered in place, and
        whether each block lies inside the mask (a device tensor: no read-back)."""
        if seq_lens is None:
            raise ValueError("a FULL_MASK tree mask is laid out by the prefix lengths: pass seq_lens")
        q = self.q_len
        lens = seq_lens[:bs].to(torch.int64)
        start = q * (torch.cumsum(lens, 0) - lens) + q * q * self.req[:bs]  # each request's block
        inside = start + q * (lens + q) <= mask.numel()
        row = (lens + q).view(bs, 1, 1) * self.node.view(1, q, 1)
        idx = (start + lens).view(bs, 1, 1) + row + self.node.view(1, 1, q)
        return mask.view(-1)[idx.clamp_(max=mask.numel() - 1)], inside

    @staticmethod
    def _widen(rows: torch.Tensor) -> torch.Tensor:
        """Packed rows as int64 holding the same low bits (uint16/32 read through their signed twin)."""
        if rows.dtype == torch.uint8:
            return rows.to(torch.int64)
        signed = _SIGNED.get(rows.dtype)
        if signed is None:
            raise ValueError(f"packed tree-mask rows are uint8/16/32, got {rows.dtype}")
        bits = torch.iinfo(signed).bits
        return rows.view(signed).to(torch.int64) & ((1 << bits) - 1)
