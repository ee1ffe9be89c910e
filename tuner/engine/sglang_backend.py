"""An attention backend on SGLang's own interface (its `AttentionBackend` as released in 0.5.23;
tests/engine/test_sglang_contract.py checks the names and signatures against that source) that
runs an MLA model's target verify and decode (q_len 1) on this package's kernel, and hands every
other mode (prefill, mixed batches) to SGLang's Triton backend over the same KV pool.
- `init_cuda_graph_state`: the mask source SGLang's draft stage writes into (`verify_mask`) and
  one workspace for every batch size, prefix range and layer, sized for the largest (batch, range)
  config; each batch size captures one config (`pick_config(q_len, bs)`) or one graph per prefix
  range (`pick_ranges(q_len, bs)`: SGLang's attention variants, `graph_variants()`,
  verify_tuner.engine.sglang_graphs), fixed from then on;
- `init_forward_metadata` (eager) refills the step's buffers (sglang_metadata.StepBuffers);
  `init_forward_metadata_out_graph` runs on the host before a capture or replay (it only stages a
  mask written elsewhere and flags a chain); `init_forward_metadata_in_graph` is the refill the
  graph records;
- `forward_extend` (target verify) / `forward_decode` write the layer's draft KV through the
  pool, then call the op on the engine's tensors in place: one 576-wide q, or SGLang's head-major
  absorbed q_nope (any token count) + q_rope; req_to_token at the requests' rows; `layer.scaling`.
The pool must be SGLang's plain page-size-1 MLA pool in a format the kernel reads (POOL_FORMATS,
verify_tuner.kernels.formats): bf16, or e4m3 (`--kv-cache-dtype fp8_e4m3`). How the kernel computes
on an e4m3 pool is the operator's choice (`kv_dtype`: `fp8_e4m3`, dequantized, by default, or
`fp8_e4m3_qk`, QK on e4m3 MMAs); a format the kernel does not read, one the pool's dtype cannot
hold, or one whose rows are not the MLA pool's 576 elements (fp8_ds_mla: FlashMLA's 656-byte rows,
which SGLang's DeepSeek-V3.2 pool holds, not this backend's) is refused when the backend is built. As SGLang's
Triton backend does, a layer with a `k_scale` stores k / k_scale in any pool, and attention scales
back by it: an e4m3 kernel reads the tensor itself (a captured graph follows a recalibrated scale);
over a bf16 pool (an fp8 checkpoint's layers have a k_scale whatever the cache) the host's
k_scale_float scales the scores and the output, as Triton reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from verify_tuner.engine import op as _op  # registers torch.ops.verify_tuner.verify_attention
from verify_tuner.engine.sglang_graphs import GraphRanges, Ranges, RangeVariants
from verify_tuner.engine.sglang_metadata import MaskSource, StepBuffers, counted_tokens
from verify_tuner.engine.tree_masks import TreeMaskMode
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.formats import KVFormat, readable
from verify_tuner.kernels.shapes import D_QK, D_V

#: SGLang's MLA pool dtype (get_key_buffer's view: float8_e4m3fn over its uint8 storage) -> the
#: kernel's KV format. e4m3 is `fp8_e4m3` (dequantized in the kernel), the mode SGLang's own
#: Triton backend computes; `fp8_e4m3_qk` would be an operator's choice, not this mapping's.
POOL_FORMATS = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8_e4m3", torch.uint8: "fp8_e4m3"}


def mla_pool_reason(f: KVFormat) -> str | None:
    """Why SGLang's MLA pool (576 elements a row, one byte or two each) cannot hold format `f`'s rows, or None."""
    if any(f.pool_row_elems(d) != D_QK for d in f.pool_dtypes):
        return f"kv_dtype {f.name} reads {f.row_bytes}-byte rows ({f.about}), SGLang's MLA pool holds {D_QK} elements a row"
    return None


def pool_format(pool_dtype: torch.dtype, kv_dtype: str | None = None, cc: int | None = None) -> str:
    """The kernel's KV format for a pool of `pool_dtype`: `kv_dtype` when given (an operator's choice
    of how to compute on it), else POOL_FORMATS'. NotImplementedError at startup, naming the reason,
    for a pool the kernel cannot read, a format it does not read yet (or not on compute capability
    `cc`, 10 * major + minor, when given), or one the pool cannot hold."""
    fmt = kv_dtype or POOL_FORMATS.get(pool_dtype)
    if fmt is None:
        raise NotImplementedError(
            f"KV pool of {pool_dtype}: the verify kernel reads {sorted(set(POOL_FORMATS.values()))}"
        )
    try:
        f = readable(fmt, cc)
    except InvalidConfig as exc:  # unknown, or known and not read yet
        raise NotImplementedError(f"KV pool of {pool_dtype}: {exc}") from None
    if str(pool_dtype).removeprefix("torch.") not in f.pool_dtypes:
        raise NotImplementedError(
            f"kv_dtype {fmt} reads a pool of {' or '.join(f.pool_dtypes)}, this one holds {pool_dtype}"
        )
    reason = mla_pool_reason(f)
    if reason:
        raise NotImplementedError(reason)
    return f.name


class VerifyMLABackend:
    """MLA target verify and decode on the kernel; other modes on `delegate` (SGLang's Triton
    backend on the same model runner), or a NotImplementedError naming the mode without one."""

    supports_ragged_verify_graph = False

    def __init__(
        self,
        *,
        pool: Any,
        req_to_token: torch.Tensor,
        heads: int,
        q_lens: tuple[int, ...],
        max_bs: int,
        max_context_len: int,
        pick_config: Callable[[int, int], KernelConfig] | None = None,
        pick_ranges: Callable[[int, int], Ranges] | None = None,
        capture_label: Callable[[], str | None] = lambda: None,
        delegate: Any = None,
        tree_mask_mode: TreeMaskMode = TreeMaskMode.QLEN_ONLY,
        kv_dtype: str | None = None,
        dp_graph_batch: bool = False,
        decodes: bool = True,
        host_counts_draft: bool = False,
    ) -> None:
        """`pick_config(q_len, bs)`: the one config of a batch size; or `pick_ranges(q_len, bs)`: its
        prefix ranges, ((0, config), (first prefix, config), ...). `capture_label()`: the attention
        variant SGLang is capturing (sglang_plugin passes SGLang's own getter). `kv_dtype`: how the
        kernel reads the pool (pool_format; None: POOL_FORMATS' default for its dtype), the same
        format the configs were picked for. `dp_graph_batch`: SGLang keys a step's graph on the largest
        batch among the DP ranks (its decode graph runner's MLP gather under DP attention), so a
        step's range is chosen among that batch size's ranges. `decodes`: whether decode (q_len 1)
        runs on the kernel; False hands it to the delegate (a speculative PD prefill node's target,
        whose only decode is SGLang's warm-up forward: no q_len-1 configs are fetched there).
        `host_counts_draft`: SGLang's host copy of a verify step's lengths (`seq_lens_cpu`, read to
        choose its range) counts the draft tokens, as DFlash and DSpark hand it."""
        self.kv_dtype = pool_format(pool.dtype, kv_dtype)
        self.token_to_kv_pool, self.req_to_token, self.delegate, self.heads = pool, req_to_token, delegate, heads
        if (pick_config is None) == (pick_ranges is None):
            raise TypeError("give pick_config (one graph per batch size) or pick_ranges (one per prefix range)")
        self.max_bs, self.max_context_len, self.dp_graph_batch = max_bs, max_context_len, dp_graph_batch
        self.decodes = decodes
        one = lambda q, bs: ((0, pick_config(q, bs)),)  # type: ignore[misc]
        self.graphs = GraphRanges(pick_ranges or one, tuple(q_lens), capture_label, host_counts_draft=host_counts_draft)
        self.tree_mask_mode, self.device = tree_mask_mode, req_to_token.device
        self.steps = {q: StepBuffers(q, max_bs, self.device) for q in q_lens}
        # SGLang's draft stage writes each step's mask in the layout verify_mask names, FULL_MASK when
        # there is none; until init_cuda_graph_state (never, with decode graphs off) this source holds
        # no batch (fits() is False), so the draft writes into a buffer of its own, in our layout.
        verify = max(self.steps)
        self._source: MaskSource | None = (
            MaskSource.make(tree_mask_mode, q_len=verify, max_bs=0, max_context_len=max_context_len, device=self.device)
            if verify > 1
            else None
        )
        self._configs: dict[tuple[int, int, int], list[int]] = {}
        self._needs: dict[tuple[int, int], int] = {}
        self._graph_bs = 0
        self._graph_ws: torch.Tensor | None = None
        self._eager_ws: torch.Tensor | None = None
        self._delegate_graph: tuple[int, int] | None = None
        self._current: tuple[int, StepBuffers, list[int], torch.Tensor] | None = None
        self._eager_mask: tuple[Any, ...] | None = None  # an eager step planned and not yet run
        self._stages = True  # whether the replay being prepared stages the draft's mask
        self.op = torch.ops.verify_tuner.verify_attention

    # -- graph state --------------------------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """The verify mask source and the workspace every captured batch size and layer shares."""
        self._graph_bs, self._delegate_graph = max_bs, (max_bs, max_num_tokens)
        verify = max(self.steps)
        if verify > 1:
            self._source = MaskSource.make(
                self.tree_mask_mode,
                q_len=verify,
                max_bs=max_bs,
                max_context_len=self.max_context_len,
                device=self.device,
            )
        need = max(self._need(q, bs) for q in self.steps for bs in range(1, max_bs + 1))
        self._graph_ws = torch.empty(need, dtype=torch.uint8, device=self.device)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    def graph_variants(self) -> RangeVariants | None:
        """SGLang's attention variants, one graph per prefix range of each batch size (None while
        every batch size has one range): sglang_plugin hands them to SGLang's graph runner."""
        return self.graphs.make_variants(self.max_bs, lambda: self._graph_bs or self.max_bs, self._graph_batch)

    @property
    def needs_cpu_seq_lens(self) -> bool:
        """Whether SGLang must copy each batch's lengths to the host: only while a batch size has
        ranges (its range is chosen from the longest); otherwise nothing here reads them."""
        return self.graphs.count(self.max_bs) > 1

    @property
    def verify_mask(self) -> MaskSource | None:
        """Where SGLang's draft stage writes the verify tree mask (in `tree_mask_mode`)."""
        return self._source

    def workspace_bytes(self) -> int:
        """Bytes of the workspace the captured batch sizes share (0 before init_cuda_graph_state)."""
        return 0 if self._graph_ws is None else self._graph_ws.numel()

    # -- per-step metadata --------------------------------------------------------------------
    def init_forward_metadata(self, forward_batch: Any) -> None:
        """Eager: refill the step's buffers and pack its mask now."""
        if not self._ours(forward_batch):
            return self._delegated("init_forward_metadata", forward_batch)
        if forward_batch.forward_mode.is_idle():  # a data-parallel rank with no requests this step
            return None
        bs, step = self._batch(forward_batch)
        i = self.graphs.range_of(forward_batch, step.q_len, bs)
        self._current = (bs, step, self._config(step.q_len, bs, i), self._workspace(step.q_len, bs))
        step.refill(bs, **self._tensors(forward_batch))
        mask = self._mask(forward_batch)
        step.pack(bs, mask, self.tree_mask_mode, forward_batch.seq_lens)
        self._eager_mask = (bs, step, forward_batch.seq_lens)
        return None

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
        """Before a capture or a replay, on the host: the config of the graph captured (its batch size
        and prefix range) or replayed, stage a mask written outside the source buffer, flag a chain."""
        if not self._ours(forward_batch):
            if in_capture and self._delegate_graph is not None and self.delegate is not None:
                self.delegate.init_cuda_graph_state(*self._delegate_graph)  # its buffers only when it is captured
                self._delegate_graph = None
            return self._delegated("init_forward_metadata_out_graph", forward_batch, in_capture)
        if forward_batch.forward_mode.is_idle():
            return None
        # an idle DP rank replays the captured graph on padding (SGLang's view keeps the captured
        # mode, its spec_info may be None): its outputs are dropped, so chain rows, and no copy of
        # the runner's all-ones mask (FULL_MASK's is tens of MB, and the other ranks wait on this one)
        actual = getattr(forward_batch, "actual_forward_mode", None) or forward_batch.forward_mode
        self._stages = not in_capture
        if not in_capture and actual.is_idle():
            self._stages = False
            for idle_step in self.steps.values():
                idle_step.set_chain(True)
            return None
        bs, step = self._batch(forward_batch)
        if bs > self._graph_bs:
            raise ValueError(f"batch {bs} past the captured {self._graph_bs} (init_cuda_graph_state)")
        assert self._graph_ws is not None  # made with _graph_bs by init_cuda_graph_state
        g = self.graphs
        i = g.captured_range(step.q_len, bs) if in_capture else g.replayed_range(forward_batch, step.q_len, bs)
        self._current = (bs, step, self._config(step.q_len, bs, i), self._graph_ws)
        if step.q_len > 1:
            mask = self._mask(forward_batch)
            step.set_chain(mask is None)
            if mask is not None and self._stages:  # at capture: the runner's placeholder
                self._source.stage(mask)  # type: ignore[union-attr]
        return None

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        """Recorded into the graph: the refill and the mask's conversion, static shapes only."""
        if not self._ours(forward_batch):
            return self._delegated("init_forward_metadata_in_graph", forward_batch)
        if forward_batch.forward_mode.is_idle():
            return None
        bs, step = self._batch(forward_batch)
        step.refill(bs, **self._tensors(forward_batch))
        if step.q_len > 1:
            step.pack_from(bs, self._source, forward_batch.seq_lens)  # type: ignore[arg-type]
        return None

    def update_verify_buffers_to_fill_after_draft(self, spec_info: Any, cuda_graph_bs: int | None) -> None:
        """The draft stage wrote the mask after the metadata was planned (on a plan stream): read it
        again. A graph's step stages it (not an idle rank's); an eager step repacks only where its own
        metadata was planned before the mask (SGLang 0.5.23 plans an eager verify later, in its
        forward, so there this finds no step: the last step's rows are not packed again)."""
        mask = spec_info.custom_mask
        if cuda_graph_bs is not None:
            if mask is not None and self._source is not None and self._stages:
                self._source.stage(mask)
        elif self._eager_mask is not None:
            bs, step, seq_lens = self._eager_mask
            step.pack(bs, mask, self.tree_mask_mode, seq_lens)

    # -- attention ----------------------------------------------------------------------------
    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: Any,
        forward_batch: Any,
        save_kv_cache: bool = True,
        q_rope: torch.Tensor | None = None,
        k_rope: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Target verify on the kernel; any other extend (prefill, mixed) on the delegate."""
        if forward_batch.forward_mode.is_target_verify():
            return self._attend(q, k, v, layer, forward_batch, save_kv_cache, q_rope, k_rope, kwargs)
        q_in, k_in = _joined(q, k, q_rope, k_rope, layer.tp_q_head_num)
        return self._delegated("forward_extend", q_in, k_in, v, layer, forward_batch, save_kv_cache, **kwargs)

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: Any,
        forward_batch: Any,
        save_kv_cache: bool = True,
        q_rope: torch.Tensor | None = None,
        k_rope: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Decode (q_len 1) on the kernel, or on the delegate where this backend does not decode."""
        if self._ours(forward_batch):
            return self._attend(q, k, v, layer, forward_batch, save_kv_cache, q_rope, k_rope, kwargs)
        q_in, k_in = _joined(q, k, q_rope, k_rope, layer.tp_q_head_num)
        return self._delegated("forward_decode", q_in, k_in, v, layer, forward_batch, save_kv_cache, **kwargs)

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: Any,
        forward_batch: Any,
        save_kv_cache: bool,
        q_rope: torch.Tensor | None,
        k_rope: torch.Tensor | None,
        extra: dict[str, Any],
    ) -> torch.Tensor:
        if any(v is not None for v in extra.values()):  # attention sinks, sparse (DSA) indices, fused rope...
            named = sorted(k for k, v in extra.items() if v is not None)
            raise NotImplementedError(f"the verify kernel computes plain MLA attention: it cannot apply {named}")
        if self._current is None:
            raise RuntimeError("forward before init_forward_metadata")
        self._eager_mask = None  # the step runs on the rows packed: a later mask update is the next step's
        bs, step, config, workspace = self._current
        heads, Q = layer.tp_q_head_num, step.q_len
        n = bs * Q
        if not n <= q.shape[0] < n + Q:  # DP attention pads fewer rows than a request's (bs = tokens // q_len)
            raise ValueError(f"q holds {q.shape[0]} tokens, the step's metadata {bs} requests x {Q}")
        k_scale = getattr(layer, "k_scale", None)
        if save_kv_cache and k is not None:
            self._store(layer, forward_batch, k, v, k_rope, k_scale)
        softmax_scale, kv_scale, out_scale = self._scales(layer, k_scale)
        kv = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        out = q.new_empty((q.shape[0], heads, D_V))
        o = out
        if q.shape[0] > n:  # slices only here: each is a dispatch an eager layer pays on the host
            # rows past bs x q_len: DP attention pads a step's tokens to a multiple of the attention-TP
            # size and leaves them to the backend (SGLang's Triton backend computes none): zeros here
            out[n:].zero_()
            q, q_rope, o = q[:n], q_rope[:n] if q_rope is not None else None, out[:n]
        kv_indptr, rows, draft, mask = step.views(bs)
        self.op(
            q.view(bs, Q, heads, -1),
            q_rope.view(bs, Q, heads, -1) if q_rope is not None else None,
            kv.view(-1, kv.shape[-1]),
            kv_indptr,
            self.req_to_token,
            rows,
            draft,
            mask,
            o.view(bs, Q, heads, D_V),
            None,
            config,
            softmax_scale,
            workspace,
            self.kv_dtype,
            1.0,
            kv_scale,
        )
        if out_scale is not None:
            o.mul_(out_scale)
        return out.view(-1, heads * D_V)

    def _scales(self, layer: Any, k_scale: Any) -> tuple[float, Any, float | None]:
        """(softmax scale, the op's kv_scale_tensor, a factor for the output) of a layer. An e4m3
        kernel reads the k_scale tensor itself (a captured graph follows a recalibrated scale). A bf16
        pool holds k / k_scale too where the layer has one -- an fp8 checkpoint gives every layer one,
        1.0 without calibrated KV scales, whatever the cache -- and SGLang's Triton backend reads it
        back times k_scale_float; the bf16 kernel takes no scale, so the scores take it in the softmax
        scale and the output (V is the same latent) after the kernel."""
        if k_scale is None:
            return layer.scaling, None, None
        if self.kv_dtype != "bf16":
            return layer.scaling, k_scale, None
        s = getattr(layer, "k_scale_float", None)
        if s is None:
            raise NotImplementedError(
                f"layer {layer.layer_id} has a k_scale but no k_scale_float: a bf16 pool's scale is read on the host"
            )
        return layer.scaling * s, None, (None if s == 1.0 else s)

    def _store(
        self, layer: Any, forward_batch: Any, k: torch.Tensor, v: Any, k_rope: torch.Tensor | None, k_scale: Any
    ) -> None:
        """The step's draft KV into the pool, as k / k_scale where the layer has one (the pool casts to
        its dtype and takes no scale: SGLang's Triton backend divides first, the same way)."""
        if k_scale is not None:
            k = k / k_scale
            k_rope = k_rope / k_scale if k_rope is not None else None
        if k_rope is not None:
            self.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)
        else:
            self.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)

    # -- helpers ------------------------------------------------------------------------------
    def _ours(self, forward_batch: Any) -> bool:
        mode = forward_batch.forward_mode
        return mode.is_target_verify() or (self.decodes and mode.is_decode_or_idle())

    def _batch(self, forward_batch: Any) -> tuple[int, StepBuffers]:
        bs = forward_batch.batch_size
        if not forward_batch.forward_mode.is_target_verify():
            return bs, self._step(1)
        info = forward_batch.spec_info
        if getattr(info, "ragged_verify_layout", None) is not None:
            raise NotImplementedError("ragged verify (per-request draft lengths) is not supported by this backend")
        return bs, self._step(int(info.draft_token_num))

    def _graph_batch(self, forward_batch: Any) -> tuple[int, StepBuffers]:
        """The batch size SGLang picks a step's graph by (before padding it to a captured one) and
        the step's buffers: under DP attention's MLP gather every rank replays the largest rank's."""
        bs, step = self._batch(forward_batch)
        if not self.dp_graph_batch:
            return bs, step
        counts = forward_batch.original_global_num_tokens_cpu
        if not counts:
            raise RuntimeError("a DP graph replay without the ranks' request counts (original_global_num_tokens_cpu)")
        return max(counts), step

    def _step(self, q_len: int) -> StepBuffers:
        step = self.steps.get(q_len)
        if step is None:
            raise ValueError(f"a step of q_len {q_len}: this backend was built for q_len {sorted(self.steps)}")
        return step

    @staticmethod
    def _tensors(forward_batch: Any) -> dict[str, Any]:
        fb = forward_batch
        return {
            "seq_lens": fb.seq_lens,
            "req_pool_indices": fb.req_pool_indices,
            "out_cache_loc": fb.out_cache_loc,
            "counted": counted_tokens(fb),
        }

    @staticmethod
    def _mask(forward_batch: Any) -> torch.Tensor | None:
        info = forward_batch.spec_info
        return None if info is None else info.custom_mask

    def _config(self, q_len: int, bs: int, i: int = 0) -> list[int]:
        """Range i's config of the batch size as the op's list (its last range past its count:
        a label the batch size has no range of repeats the last), fixed at its first use."""
        configs = self.graphs.configs(q_len, bs)
        i = min(i, len(configs) - 1)
        got = self._configs.get((q_len, bs, i))
        if got is None:
            got = self._configs[(q_len, bs, i)] = _op.config_list(configs[i])
        return got

    def _need(self, q_len: int, bs: int) -> int:
        """Workspace bytes for the batch size, the largest of its ranges' configs."""
        got = self._needs.get((q_len, bs))
        if got is None:
            got = self._needs[(q_len, bs)] = max(
                _op.workspace_bytes(self._config(q_len, bs, i), H=self.heads, q_len=q_len, batch=bs)
                for i in range(len(self.graphs.configs(q_len, bs)))
            )
        return got

    def _workspace(self, q_len: int, bs: int) -> torch.Tensor:
        """The shared graph workspace when it is large enough, else the eager one, grown as needed."""
        need = self._need(q_len, bs)
        if self._graph_ws is not None and self._graph_ws.numel() >= need:
            return self._graph_ws
        if self._eager_ws is None or self._eager_ws.numel() < need:
            self._eager_ws = torch.empty(need, dtype=torch.uint8, device=self.device)
        return self._eager_ws

    def _delegated(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.delegate is None:
            mode = args[0].forward_mode if name.startswith("init") else args[4].forward_mode
            raise NotImplementedError(f"{mode!r} runs on SGLang's Triton backend, which this backend was built without")
        return getattr(self.delegate, name)(*args, **kwargs)


def _joined(
    q: torch.Tensor, k: torch.Tensor | None, q_rope: torch.Tensor | None, k_rope: torch.Tensor | None, heads: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The absorbed q (and k) as the Triton backend takes them: one 576-wide tensor each."""
    if q_rope is None:
        return q, k
    q = torch.cat([q.view(-1, heads, D_V), q_rope.view(-1, heads, D_QK - D_V)], dim=-1)
    if k is not None:
        k = torch.cat([k.view(-1, 1, D_V), k_rope.view(-1, 1, D_QK - D_V)], dim=-1)  # type: ignore[union-attr]
    return q, k
