"""The device buffers a verify (or decode) step's attention reads, refilled in place from SGLang's
ForwardBatch: what `VerifyMLABackend.init_forward_metadata_in_graph` records into the engine's
CUDA graph, so a replay refills them with no host work.

SGLang hands a step over as `seq_lens` [bs] (in target verify the prefixes, without the draft
tokens; in decode the lengths with the step's own token, which SGLang adds before the step and puts
at req_to_token[row, seq_len - 1]: `counted_tokens`), `req_pool_indices` [bs] (each request's row
of `req_to_token`, which the kernel reads in place), `out_cache_loc` [bs * q_len] (the step's own
tokens' slots, written by the layer before attention) and
the tree mask in the backend's declared layout (`MaskSource`), or none for a chain. The buffers
are sized for the largest batch the engine can run (its request pool), so an eager batch past the
captured graphs fits too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from verify_tuner.engine.tree_masks import MaskPacker, TreeMaskMode, mask_numel, packed_dtype


@dataclass
class MaskSource:
    """The buffer SGLang's draft stage writes the verify mask into, at a fixed address a captured
    graph reads: the backend's `verify_mask`, shaped like SGLang's VerifyMask (buffer, mode,
    max_bs, is_read, fits), which the draft stage reads off the target's backend."""

    buffer: torch.Tensor
    mode: TreeMaskMode
    max_bs: int
    is_read: bool = True

    @classmethod
    def make(
        cls, mode: TreeMaskMode, *, q_len: int, max_bs: int, max_context_len: int, device: torch.device
    ) -> MaskSource:
        n = mask_numel(TreeMaskMode(mode), bs=max_bs, q_len=q_len, max_context_len=max_context_len)
        if TreeMaskMode(mode) != TreeMaskMode.QLEN_ONLY_BITPACKING:
            return cls(torch.zeros(n, dtype=torch.bool, device=device), mode, max_bs)
        packed = packed_dtype(q_len)  # torch fills unsigned 16/32-bit types on few devices: zero bytes instead
        raw = torch.zeros(n * torch.empty(0, dtype=packed).element_size(), dtype=torch.uint8, device=device)
        return cls(raw.view(packed), mode, max_bs)

    def fits(self, bs: int) -> bool:
        return bs <= self.max_bs

    def stage(self, mask: torch.Tensor) -> None:
        """Copy a mask written elsewhere (in this layout) into the buffer the graph reads."""
        if mask.data_ptr() != self.buffer.data_ptr():  # byte views: uint16/32 rows copy on every device
            raw, dst = mask.reshape(-1).view(torch.uint8), self.buffer.view(torch.uint8)
            n = min(raw.numel(), dst.numel())
            dst[:n].copy_(raw[:n])


def counted_tokens(forward_batch: Any) -> int:
    """How many of the step's own tokens `seq_lens` already counts: decode's one (SGLang raises each
    length before the step, so the prefix is seq_len - 1), none in target verify."""
    return 0 if forward_batch.forward_mode.is_target_verify() else 1


@dataclass
class StepBuffers:
    """The op's per-step inputs for one q_len: a batch of bs reads [:bs] of each (views cached)."""

    q_len: int
    max_bs: int
    device: torch.device
    kv_indptr: torch.Tensor = field(init=False)  # [max_bs + 1] int32: the prefix lengths' running sum
    rows: torch.Tensor = field(init=False)  # [max_bs] int32: each request's row of req_to_token
    draft: torch.Tensor = field(init=False)  # [max_bs, q_len] int32: the draft tokens' slots
    mask: torch.Tensor = field(init=False)  # [max_bs, q_len] int64 mask rows
    packer: MaskPacker = field(init=False)
    chain: torch.Tensor = field(init=False)  # [1] int64: 1 while the step's verify is a chain (no mask)
    _chain_now: bool | None = field(init=False, default=None)
    _scratch: torch.Tensor = field(init=False)
    _ramp: torch.Tensor = field(init=False)  # [max_bs] int32: 1..max_bs, what a step's counted tokens add up to
    _views: dict[int, tuple[torch.Tensor, ...]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        i32: dict[str, Any] = {"dtype": torch.int32, "device": self.device}
        self.kv_indptr = torch.zeros(self.max_bs + 1, **i32)
        self.rows = torch.zeros(self.max_bs, **i32)
        self.draft = torch.zeros(self.max_bs, self.q_len, **i32)
        self.packer = MaskPacker(q_len=self.q_len, max_bs=self.max_bs, device=self.device)
        self.mask = self.packer.chain_rows.clone()  # decode (q_len 1) keeps these: a token sees itself
        self._scratch = torch.zeros_like(self.mask)
        self.chain = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._ramp = torch.arange(1, self.max_bs + 1, **i32)

    def views(self, bs: int) -> tuple[torch.Tensor, ...]:
        """(kv_indptr, rows, draft, mask) of a batch of bs, made once per batch size."""
        got = self._views.get(bs)
        if got is None:
            got = self._views[bs] = (self.kv_indptr[: bs + 1], self.rows[:bs], self.draft[:bs], self.mask[:bs])
        return got

    def refill(
        self,
        bs: int,
        *,
        seq_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        out_cache_loc: torch.Tensor,
        counted: int = 0,
    ) -> None:
        """Copy a batch's prefix lengths (`seq_lens` less the `counted` tokens of the step each one
        holds), rows and the step's slots in: static shapes, no host read-back."""
        if not 1 <= bs <= self.max_bs:
            raise ValueError(f"batch {bs} outside 1..{self.max_bs} (the request pool the backend was built for)")
        if out_cache_loc.numel() < bs * self.q_len:
            raise ValueError(f"out_cache_loc holds {out_cache_loc.numel()} slots, not a batch of {bs} x {self.q_len}")
        torch.cumsum(seq_lens[:bs], dim=0, dtype=torch.int32, out=self.kv_indptr[1 : bs + 1])
        if counted:
            self.kv_indptr[1 : bs + 1].sub_(self._ramp[:bs], alpha=counted)
        self.rows[:bs].copy_(req_pool_indices[:bs])
        self.draft[:bs].copy_(out_cache_loc[: bs * self.q_len].view(bs, self.q_len))

    def pack(self, bs: int, mask: torch.Tensor | None, mode: TreeMaskMode, seq_lens: torch.Tensor) -> None:
        """The batch's mask rows now (eager): from `mask` in `mode`, or a chain when it is None."""
        if self.q_len > 1:
            self.packer.pack(mask, mode, bs=bs, out=self.mask, seq_lens=seq_lens)

    def pack_from(self, bs: int, source: MaskSource, seq_lens: torch.Tensor) -> None:
        """The batch's mask rows as a graph records them: from the fixed source, or the chain rows
        while `chain` is set (set_chain, before the replay)."""
        if self.q_len > 1:
            self.packer.pack(source.buffer, source.mode, bs=bs, out=self._scratch, seq_lens=seq_lens)
            torch.where(self.chain.bool(), self.packer.chain_rows[:bs], self._scratch[:bs], out=self.mask[:bs])

    def set_chain(self, chain: bool) -> None:
        """Whether the next replay's verify is a chain (DFlash passes no mask): one fill when it changes."""
        if chain != self._chain_now:
            self.chain.fill_(int(chain))
            self._chain_now = chain
