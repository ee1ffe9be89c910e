"""The verify path of an SGLang-style MLA attention backend, on the torch op.

An engine captures its verify step once per batch size and replays it every step; between
replays it refills device buffers in place (SGLang: `init_forward_metadata_replay_cuda_graph`).
This class holds those buffers for one (H, q_len) and turns the tensors an engine already has
into the op's inputs without copying the KV pool or its index table:
- page size 1 (SGLang's MLA backends): the prefix slots are read in place from the engine's
  `req_to_token` [max_requests, max_context] at the rows `req_pool_indices` names;
- a paged pool [pages, page_size, 576] with a block table [B, max_pages] of page ids (vLLM,
  FlashMLA style): the table is copied into the captured buffer (it is per batch);
- q as one [tokens, H, 576] tensor or as q_nope [tokens, H, 512] + q_pe [tokens, H, 64] views;
- the tree mask as uint64 rows or the uint8/16/32 rows of SGLang's QLEN_ONLY_BITPACKING, read at
  their width by the kernel.
What changes per step is copied into the captured buffers: prefix lengths (their running sum, by
torch.cumsum into kv_indptr), the requests' pool rows or block table, the draft tokens' slots
(`out_cache_loc`) and the mask. The config of each batch size is fixed at capture, from the
fetched table; the kernel shares the batch's work out at run time, so it serves every prefix
the graph replays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from verify_tuner.engine import op as _op  # registers torch.ops.verify_tuner.verify_attention
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.shapes import D_QK, D_V
from verify_tuner.kernels.validate import MAX_Q_LEN

#: SGLang's packed mask row types, by the q_len they hold (QLEN_ONLY_BITPACKING), then uint64.
PACKED_MASK = ((8, torch.uint8), (16, torch.uint16), (32, torch.uint32), (64, torch.int64))


def mask_dtype_for(q_len: int) -> torch.dtype:
    """The row type SGLang packs a q_len-node tree mask into (int64 rows past 32 nodes)."""
    if not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(f"q_len must be in 1..{MAX_Q_LEN} (a uint64 tree-mask row), got {q_len}")
    return next(dtype for bits, dtype in PACKED_MASK if q_len <= bits)


@dataclass
class _Buffers:
    """The captured graph's inputs, sized for the largest batch; a batch of bs uses [:bs]."""

    kv_indptr: torch.Tensor  # [max_bs + 1] int32
    rows: torch.Tensor | None  # [max_bs] int32 pool rows (req_to_token mode)
    table: torch.Tensor | None  # [max_bs, max_pages] int32 page ids (block-table mode)
    draft: torch.Tensor  # [max_bs, q_len] int32
    mask: torch.Tensor  # [max_bs, q_len]


class VerifyBackend:
    """Verify attention for one (H, q_len) on one device, eager or one CUDA graph per batch size.

    Pass `req_to_token` for a page-size-1 pool [S, 576] (SGLang), or `max_pages` for a paged pool
    [pages, page_size, 576] with a block table per step. `pick_config(bs)` chooses each batch
    size's config (e.g. `lambda bs: client.lookup(expected_prefix, batch=bs)` with the light
    client, or the table's graph plan)."""

    def __init__(
        self,
        *,
        H: int,
        q_len: int,
        kv_pool: torch.Tensor,
        pick_config: Callable[[int], KernelConfig],
        max_batch: int,
        softmax_scale: float,
        req_to_token: torch.Tensor | None = None,
        max_pages: int | None = None,
        mask_dtype: torch.dtype | None = None,
    ) -> None:
        if not 1 <= q_len <= MAX_Q_LEN:  # the mask's row type and the kernel both stop there
            raise ValueError(f"q_len must be in 1..{MAX_Q_LEN} (a uint64 tree-mask row), got {q_len}")
        if (req_to_token is None) == (max_pages is None):
            raise ValueError("give req_to_token (page size 1) or max_pages (a paged pool's block table), not both")
        self.H, self.q_len, self.kv, self.scale = H, q_len, kv_pool, softmax_scale
        self.req_to_token, self.pick_config, self.max_batch = req_to_token, pick_config, max_batch
        dev = kv_pool.device
        i32: dict[str, Any] = {"dtype": torch.int32, "device": dev}
        self.buf = _Buffers(
            kv_indptr=torch.zeros(max_batch + 1, **i32),
            rows=torch.zeros(max_batch, **i32) if req_to_token is not None else None,
            table=torch.zeros(max_batch, max_pages, **i32) if max_pages is not None else None,
            draft=torch.zeros(max_batch, q_len, **i32),
            mask=torch.zeros(max_batch, q_len, dtype=mask_dtype or mask_dtype_for(q_len), device=dev),
        )
        self.configs: dict[int, KernelConfig] = {}
        self._lists: dict[int, list[int]] = {}
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}

    def for_layer(self, kv_pool: torch.Tensor) -> VerifyBackend:
        """The same backend over another layer's KV pool, sharing this one's buffers and configs:
        an engine refills the step's metadata once for all of its layers."""
        if kv_pool.shape[1:] != self.kv.shape[1:] or kv_pool.device != self.kv.device:
            raise ValueError(
                f"layer pool {list(kv_pool.shape)} on {kv_pool.device} is not laid out like {list(self.kv.shape)}"
            )
        twin = object.__new__(VerifyBackend)
        twin.__dict__.update(self.__dict__)
        twin.kv, twin.graphs = kv_pool, {}
        return twin

    def config_for(self, bs: int) -> KernelConfig:
        """The batch size's config, fixed the first time it is asked for (at capture)."""
        if bs not in self.configs:
            self.configs[bs] = self.pick_config(bs)
        return self.configs[bs]

    def _config_list(self, bs: int) -> list[int]:
        """config_for(bs) as the op's list, made once (every layer's call passes it)."""
        got = self._lists.get(bs)
        if got is None:
            got = self._lists[bs] = _op.config_list(self.config_for(bs))
        return got

    def init_forward_metadata(
        self,
        bs: int,
        *,
        seq_lens: torch.Tensor,
        out_cache_loc: torch.Tensor,
        tree_mask: torch.Tensor,
        req_pool_indices: torch.Tensor | None = None,
        block_table: torch.Tensor | None = None,
    ) -> None:
        """Refill the buffers of a batch of `bs` in place (no allocation: safe before a replay):
        seq_lens [bs] prefix lengths, out_cache_loc [bs * q_len] the draft tokens' slots,
        tree_mask [bs, q_len] rows (any integer width that holds q_len bits), and the requests'
        pool rows (req_to_token mode) or their block table rows (paged mode)."""
        if not 1 <= bs <= self.max_batch:
            raise ValueError(f"batch {bs} outside 1..{self.max_batch} this backend was built for")
        # shorter than bs, torch would resize the cumsum's output or broadcast one row to every request
        for name, t in (("seq_lens", seq_lens), ("req_pool_indices", req_pool_indices), ("block_table", block_table)):
            if t is not None and (t.dim() == 0 or t.shape[0] < bs):
                raise ValueError(f"{name} must hold a row for each of the {bs} requests, got {list(t.shape)}")
        b = self.buf
        torch.cumsum(seq_lens[:bs], dim=0, dtype=torch.int32, out=b.kv_indptr[1 : bs + 1])
        b.draft[:bs].copy_(out_cache_loc.view(bs, self.q_len))
        mask = tree_mask.view(bs, self.q_len)
        if mask.dtype != b.mask.dtype:  # the same bits under another signedness are the same rows
            if mask.element_size() != b.mask.element_size():
                raise ValueError(
                    f"tree_mask rows are {mask.dtype}; this backend holds {b.mask.dtype} rows (mask_dtype)"
                )
            mask = mask.view(b.mask.dtype)
        b.mask[:bs].copy_(mask)
        if b.rows is not None:
            if req_pool_indices is None:
                raise ValueError("req_to_token mode: pass req_pool_indices")
            b.rows[:bs].copy_(req_pool_indices[:bs])
        else:
            if block_table is None:
                raise ValueError("paged mode: pass block_table")
            assert b.table is not None
            pages = block_table.shape[1]
            if pages > b.table.shape[1]:
                raise ValueError(f"block_table has {pages} pages a request, this backend holds {b.table.shape[1]}")
            b.table[:bs, :pages].copy_(block_table[:bs])

    def forward(
        self,
        q: torch.Tensor,
        q_pe: torch.Tensor | None,
        out: torch.Tensor,
        lse: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The op on the current buffers: q [bs*q_len, H, 576] (or q_nope [.., 512] with q_pe
        [.., 64]), out [bs*q_len, H, 512]; the batch size is q's token count / q_len."""
        bs = q.shape[0] // self.q_len
        b = self.buf
        as4 = (bs, self.q_len, self.H)
        torch.ops.verify_tuner.verify_attention(
            q.view(*as4, q.shape[-1]),
            q_pe.view(*as4, q_pe.shape[-1]) if q_pe is not None else None,
            self.kv,
            b.kv_indptr[: bs + 1],
            self.req_to_token if b.rows is not None else b.table[:bs],  # type: ignore[index]
            b.rows[:bs] if b.rows is not None else None,
            b.draft[:bs],
            b.mask[:bs],
            out.view(*as4, D_V),
            lse.view(*as4) if lse is not None else None,
            self._config_list(bs),
            self.scale,
            None,  # the op's own workspace for this batch size
        )
        return out

    def capture(self, bs: int, *, q_dims: int = D_QK, lse: bool = False) -> dict[str, torch.Tensor]:
        """Capture the verify step of a batch of `bs` as a CUDA graph on a side stream, over
        static q / out (/ lse) tensors it returns: the engine writes q into them (or captures
        this inside its own graph) and calls init_forward_metadata + replay(bs) every step.
        q_dims 576 captures one q; 512 captures q_nope + q_pe."""
        dev = self.kv.device
        n = bs * self.q_len
        io = {"q": torch.zeros(n, self.H, q_dims, dtype=torch.bfloat16, device=dev)}
        if q_dims == D_V:
            io["q_pe"] = torch.zeros(n, self.H, D_QK - D_V, dtype=torch.bfloat16, device=dev)
        io["out"] = torch.empty(n, self.H, D_V, dtype=torch.bfloat16, device=dev)
        if lse:
            io["lse"] = torch.empty(n, self.H, dtype=torch.float32, device=dev)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # the first call loads the cubin and makes the workspace
            self.forward(io["q"], io.get("q_pe"), io["out"], io.get("lse"))
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            self.forward(io["q"], io.get("q_pe"), io["out"], io.get("lse"))
        self.graphs[bs] = (graph, io)
        return io

    def replay(self, bs: int) -> dict[str, torch.Tensor]:
        """Replay the batch size's graph on the buffers as last refilled; its static tensors."""
        graph, io = self.graphs[bs]
        graph.replay()
        return io
