"""The verify backend as an SGLang plugin: `--attention-backend verify_tuner`.

SGLang (0.5.23) loads the `sglang.srt.plugins` entry points of installed packages in every
process it starts (server, scheduler, workers), before it parses its arguments; this package
declares `register` there (pyproject.toml). `register` adds the name to the --attention-backend
choices, registers the factory with `register_attention_backend`, and lists the name among the
backends DeepSeek-style MLA layers hand the absorbed q to (q_nope head-major + q_rope, no copy).
Nothing changes for a server that picks another backend. Only this module imports SGLang, and
only when SGLang calls it.

The factory builds `VerifyMLABackend` over the runner's own pool, with SGLang's Triton backend on
the same runner for the modes it hands over (prefill, mixed batches), and a config client per
q_len: each captured batch size's configs are the ranges of the client's graph plan set (sidecar,
config folder, snapshot or the heuristic, as `verify_tuner.engine.client` says), fixed when the
graphs are set up. Drafts run on SGLang's Triton backend (`--speculative-draft-attention-backend
triton`); a draft runner that reaches this factory without it is told so. The verify mask's layout
follows the speculative algorithm (tree_mask_mode): q_len x q_len cells for those that write in the
layout the backend asks for, the full-context one for NGRAM and FROZEN_KV_MTP.

The configs are those of the pool's KV format, the one the kernel reads it as (an e4m3 pool:
`fp8_e4m3`, or what VERIFY_TUNER_KV_DTYPE names, e.g. `fp8_e4m3_qk`): a table tuned for bf16 is
not served to an e4m3 cache.

Graphs per prefix range: SGLang's decode graph runner takes its attention variants (a graph per
label and batch size, one label chosen per step: verify_tuner.engine.sglang_graphs) from
`create_dsv41_candidate_graph_variants(model_runner, ...)` for models without variants of their
own; `register` wraps it with SGLang's plugin hook registry (an AROUND hook), so a runner whose
backend is this one gets the backend's variants, and every other runner what SGLang gives it.
"""

from __future__ import annotations

import logging
from typing import Any

NAME = "verify_tuner"
#: where SGLang's graph runner gets its attention variants for a model without its own
VARIANTS_HOOK = "sglang.srt.layers.attention.graph_variants.create_dsv41_candidate_graph_variants"
#: how the kernel computes on the pool (a kv_dtype of verify_tuner.kernels.formats); unset: the pool's default
KV_DTYPE_ENV = "VERIFY_TUNER_KV_DTYPE"
log = logging.getLogger(__name__)
_hooked = False


def register() -> None:
    """SGLang's general-plugin hook: make `--attention-backend verify_tuner` a choice that builds
    this backend."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import register_attention_backend
    from sglang.srt.models.deepseek_common.utils import FORWARD_ABSORB_CORE_ATTENTION_BACKENDS

    if NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([NAME])
    register_attention_backend(NAME)(create)
    if NAME not in FORWARD_ABSORB_CORE_ATTENTION_BACKENDS:  # the absorbed q_nope + q_rope, read in place
        FORWARD_ABSORB_CORE_ATTENTION_BACKENDS.append(NAME)
    _hook_variants()


def _hook_variants() -> None:
    """Register the AROUND hook on SGLang's variants factory once per process (SGLang applies the
    registered hooks after running the plugins; a second hook would wrap the first)."""
    global _hooked
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if not _hooked:
        HookRegistry.register(VARIANTS_HOOK, graph_variants, HookType.AROUND)
        _hooked = True


def graph_variants(original: Any, model_runner: Any, *args: Any, **kwargs: Any) -> Any:
    """The hook: this backend's graphs per prefix range for a target runner built on it, else
    SGLang's own answer."""
    from verify_tuner.engine.sglang_backend import VerifyMLABackend

    backend = getattr(model_runner, "attn_backend", None)
    select = getattr(backend, "_select_backend", None)  # SGLang's HybridAttnBackend: the mode's own backend
    if select is not None and args:
        backend = select(args[0])  # the mode the runner captures (decode, or target verify)
    if isinstance(backend, VerifyMLABackend) and not model_runner.is_draft_worker:
        variants = backend.graph_variants()
        if variants is not None:
            log.info("%s: %d graphs per batch size, one per prefix range", NAME, len(variants.capture_labels))
            return variants
    return original(model_runner, *args, **kwargs)


def create(runner: Any) -> Any:
    """The backend for a model runner (SGLang's factory signature)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    if runner.is_draft_worker:
        # Only a draft runner without a backend of its own gets here. A Triton backend under this
        # name would be handed the absorbed q_rope/k_rope keywords, which Triton's forward_extend
        # does not take, and SGLang's draft stage knows no draft backend by this name.
        raise ValueError(
            f"--attention-backend {NAME} runs the target model's verify and decode; "
            "pass --speculative-draft-attention-backend triton for the draft model"
        )
    _check_runner(runner)
    return build(runner, delegate=TritonAttnBackend(runner))


def _check_runner(runner: Any) -> None:
    """What the kernel cannot serve, said before a graph is captured."""
    from sglang.srt.environ import envs
    from sglang.srt.runtime_context import get_exec, get_parallel, get_spec

    if not runner.use_mla_backend:
        raise ValueError(f"--attention-backend {NAME} runs MLA models (DeepSeek-V3, Kimi K2 style)")
    mc = runner.model_config
    if any(getattr(getattr(mc, c, None), "llama_4_scaling", None) is not None for c in ("hf_config", "hf_text_config")):
        # SGLang scales such a model's q by position only on the path that joins q_nope and q_rope;
        # a backend listed as taking the absorbed q (this one) is never handed the factor.
        raise ValueError(
            f"--attention-backend {NAME} cannot apply this model's llama_4_scaling (Mistral-Large-3): "
            "SGLang does not pass it to absorbed-q backends; serve it with --attention-backend triton"
        )
    if (runner.page_size or 1) != 1:
        raise ValueError(f"--attention-backend {NAME} reads a page-size-1 KV pool: pass --page-size 1")
    if get_parallel().attn_dcp_size > 1:
        raise ValueError(f"--attention-backend {NAME} does not run decode context parallelism (--dcp-size 1)")
    if runner.kv_index_translator.is_translating:
        raise ValueError(
            f"--attention-backend {NAME} reads req_to_token's ids as slots: a unified KV pool translates them"
        )
    spec = runner.spec_algorithm
    speculative = not spec.is_none()
    _check_sides(runner, speculative, get_spec().speculative_attention_mode)
    if speculative and get_exec().overlap.enable_two_batch_overlap:
        raise ValueError(
            f"--attention-backend {NAME} with speculative decoding does not run two-batch overlap: SGLang splits "
            "the verify mask at full-context offsets (--enable-two-batch-overlap off)"
        )
    if (spec.is_ngram() or spec.is_frozen_kv_mtp()) and envs.SGLANG_ENABLE_METADATA_GLUE_GRAPH.get():
        # the glue graph replays each step's metadata prep as captured: the copy of a mask these
        # algorithms allocate afresh every step would read the first step's (freed) buffer
        raise ValueError(
            f"--attention-backend {NAME} with {spec.name} verify masks cannot run under "
            "SGLANG_ENABLE_METADATA_GLUE_GRAPH=1: unset it"
        )
    if spec.supports_ragged_verify() and envs.SGLANG_RAGGED_VERIFY_MODE.get() != "static":
        # per-request verify lengths reach the backend only at the first such step: said here instead
        raise ValueError(
            f"--attention-backend {NAME} verifies one draft length a step: SGLANG_RAGGED_VERIFY_MODE="
            f"{envs.SGLANG_RAGGED_VERIFY_MODE.get()} gives {spec.name} per-request lengths; leave it static"
        )
    if speculative and get_spec().speculative_adaptive:
        raise ValueError(
            f"--attention-backend {NAME} serves one draft length a server: --speculative-adaptive switches among several"
        )


def _check_sides(runner: Any, speculative: bool, spec_mode: str) -> None:
    """With --prefill-attention-backend and --decode-attention-backend apart, SGLang runs decode on
    the decode backend and target verify on the prefill one unless --speculative-attention-mode is
    `decode`: refused where this backend would run neither (only prefill, which it hands to Triton)."""
    prefill, decode = runner.prefill_attention_backend_str, runner.decode_attention_backend_str
    if prefill == decode:
        return
    if not speculative:
        if decode != NAME:
            raise ValueError(f"--prefill-attention-backend {NAME} runs nothing: name it the decode backend")
        return
    verifies = decode if spec_mode == "decode" else prefill
    if verifies != NAME:
        side = "decode" if decode == NAME else "prefill"
        raise ValueError(
            f"--{side}-attention-backend {NAME}: target verify runs on the {verifies} backend with "
            f"--speculative-attention-mode {spec_mode}; pass --speculative-attention-mode {side}"
        )


def tree_mask_mode(algorithm: Any, modes: Any) -> Any:
    """The verify mask layout the speculative `algorithm` hands the backend (a member of SGLang's
    TreeMaskMode, `modes`). EAGLE, EAGLE3 and STANDALONE build their trees through SGLang's
    eagle_worker_common, which writes in the layout the target backend's verify_mask names
    (q_len x q_len cells: QLEN_ONLY); DFlash and DSpark verify chains (no mask). NGRAM and
    FROZEN_KV_MTP always write the full-context layout (bs x q_len x (prefix + q_len) cells),
    whatever the backend asks for. Any other algorithm's layout is unknown: refused, since a mask
    read in the wrong layout gives wrong attention without an error."""
    if algorithm.is_none():
        return modes.QLEN_ONLY  # decode only: no verify mask
    if algorithm.is_ngram() or algorithm.is_frozen_kv_mtp():
        return modes.FULL_MASK
    if algorithm.is_eagle() or algorithm.is_standalone() or algorithm.is_dflash_family():
        return modes.QLEN_ONLY
    raise ValueError(
        f"--attention-backend {NAME}: the verify mask layout of speculative algorithm {algorithm!r} is not known "
        "(EAGLE, EAGLE3, STANDALONE, DFLASH, DSPARK, NGRAM and FROZEN_KV_MTP are)"
    )


def build(runner: Any, *, delegate: Any) -> Any:
    """VerifyMLABackend on SGLang's AttentionBackend (its defaults for what this backend leaves alone)."""
    import os

    import torch
    from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend, SharedReadEnds
    from sglang.srt.model_executor.runner_utils.capture_mode import get_capture_attention_variant
    from sglang.srt.runtime_context import get_disagg, get_parallel
    from sglang.srt.utils import get_cuda_graph_max_batch_size
    from verify_tuner.engine.sglang_backend import VerifyMLABackend, pool_format
    from verify_tuner.kernels.limits import known_device

    def shared_read_ends(self: Any, fm: Any) -> Any:
        # The kernel reads req_to_token, which the scheduler shares, in place in every layer, until
        # the replay ends -- not only in the graph's metadata refill, SGLang's default for decode and
        # verify (IN_REPLAY), after which the scheduler's next writes may start.
        if fm.is_decode() or fm.is_target_verify():
            return SharedReadEnds.POST_REPLAY
        return AttentionBackend.shared_read_ends(self, fm)

    cls = type("VerifyTunerAttnBackend", (VerifyMLABackend, AttentionBackend), {"shared_read_ends": shared_read_ends})
    device = torch.cuda.get_device_name(runner.gpu_id)
    # the format first: what the pool cannot be read as (on this GPU) stops here, before any config is fetched
    limits = known_device(device)
    chosen = os.environ.get(KV_DTYPE_ENV) or None
    try:
        kv_dtype = pool_format(
            runner.token_to_kv_pool.dtype, chosen, limits.cc_major * 10 + limits.cc_minor if limits else None
        )
    except NotImplementedError as exc:
        if chosen is None:
            raise
        raise NotImplementedError(f"{KV_DTYPE_ENV}={chosen}: {exc}") from None
    heads = runner.model_config.get_max_num_attention_heads() // get_parallel().attn_tp_size
    q_len = runner.decode_num_tokens_per_req()
    context = runner.model_config.context_len
    pool_size = runner.req_to_token_pool.size
    max_bs = max(pool_size, get_cuda_graph_max_batch_size(pool_size))
    pick = _range_picker(
        heads, q_len, device=device, max_prefix=context, kv_dtype=kv_dtype, max_bs=max_bs, tp=get_parallel().tp_group
    )
    backend = cls(
        pool=runner.token_to_kv_pool,
        req_to_token=runner.req_to_token_pool.req_to_token,
        heads=heads,
        q_lens=(q_len,),
        max_bs=max_bs,
        max_context_len=context,
        pick_ranges=pick,
        capture_label=get_capture_attention_variant,
        delegate=delegate,
        tree_mask_mode=tree_mask_mode(runner.spec_algorithm, TreeMaskMode),
        kv_dtype=kv_dtype,
        # the graph runner's own rule for which batch size a DP step replays (the largest rank's)
        dp_graph_batch=runner.decode_graph_gather_requirements()[0],
        # a speculative PD prefill node's target verifies nothing and decodes only SGLang's warm-up
        # forward (flashinfer autotune): q_len 1 has no configs here, so Triton runs it
        decodes=runner.spec_algorithm.is_none() or get_disagg().disaggregation_mode != "prefill",
        # DFlash's and DSpark's verify raise seq_lens_cpu by the draft block (not seq_lens) for a
        # backend without make_forward_metadata_from_raw_verify, as this one is
        host_counts_draft=runner.spec_algorithm.is_dflash_family(),
    )
    backend.kv_index_translator = runner.kv_index_translator
    if hasattr(delegate, "extend_attention_block_m"):  # the scheduler sizes prefill chunks by the prefill kernel's tile
        backend.extend_attention_block_m = delegate.extend_attention_block_m
    if hasattr(delegate, "extend_dummy_seqs_capped_by_req_pool"):  # its extend metadata is sized by the request pool
        backend.extend_dummy_seqs_capped_by_req_pool = delegate.extend_dummy_seqs_capped_by_req_pool
    return backend


def _range_picker(heads: int, q_len: int, *, device: str, max_prefix: int, kv_dtype: str, max_bs: int, tp: Any) -> Any:
    """pick_ranges(q_len, bs): the ranges of the config client's graph plan set for the batch size,
    from the table of the pool's KV format, as the first rank of the tensor-parallel group `tp`
    (SGLang's GroupCoordinator) fetched them. SGLang captures a graph per range label on every
    rank, with collectives in each capture: ranks that fetched different tables (one of them timed
    out on the sidecar) would capture different counts and wait on each other for ever, so the
    other ranks fetch nothing and take the first rank's ranges for every batch size."""
    from verify_tuner.batches import MAX_BATCH
    from verify_tuner.engine.client import ConfigClient

    def first_rank_ranges() -> tuple[str, dict[int, Any] | None]:
        client = ConfigClient(H=heads, q_len=q_len, device=device, kv_dtype=kv_dtype)
        source = client.fetch()
        log.info("%s: %s configs for H=%d q_len=%d from %s: %s", NAME, kv_dtype, heads, q_len, source, client.reason)
        if source == "none":
            return client.reason, None

        def ranges(bs: int) -> tuple[tuple[int, Any], ...]:
            got = client.graph_plans(bs, max_prefix=max_prefix)
            return tuple((r.prefix_range[0] if i else 0, r.config) for i, r in enumerate(got))  # type: ignore[index]

        return client.reason, {bs: ranges(bs) for bs in range(1, min(max_bs, MAX_BATCH) + 1)}

    plans: tuple[str, dict[int, Any] | None] | None = None
    failed: BaseException | None = None
    if tp.rank_in_group == 0:
        try:
            plans = first_rank_ranges()
        except Exception as exc:  # noqa: BLE001 -- told to the other ranks, then raised here with its traceback
            failed, plans = exc, (f"the first TP rank failed: {type(exc).__name__}: {exc}", None)
    if tp.world_size > 1:  # before any rank raises: a rank left waiting here would hang its server
        import torch.distributed as dist

        box = [plans]
        dist.broadcast_object_list(box, src=tp.ranks[0], group=tp.cpu_group)
        plans = box[0]
    if failed is not None:
        raise failed
    assert plans is not None  # the first rank's, here or broadcast
    reason, table = plans
    if table is None:
        raise RuntimeError(f"--attention-backend {NAME}: no kernel config for {device} ({reason})")

    def pick(q: int, bs: int) -> Any:
        if q != q_len:
            raise ValueError(f"configs were fetched for q_len {q_len}, asked for {q}")
        if not 1 <= bs <= max_bs:
            raise ValueError(f"batch {bs} outside 1..{max_bs}, the batches configs were fetched for")
        return table[min(bs, MAX_BATCH)]

    return pick
