"""The contract with SGLang 0.5.23, read from its released wheel (AST, no import): our backend's
methods against its `AttentionBackend`, and every name of SGLang the backend and its plugin use.
A release that renames or reshapes any of them fails here, loudly, naming what moved."""

from __future__ import annotations

import ast
import copy
import tomllib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.engine import sglang_plugin
from verify_tuner.engine.sglang_backend import VerifyMLABackend
from verify_tuner.engine.sglang_metadata import MaskSource
from verify_tuner.engine.tree_masks import TreeMaskMode

from tests.engine.sglang_source import Source, decorators, fetch_wheel, methods, mismatches

ROOT = Path(__file__).resolve().parents[2]
BASE = "sglang.srt.layers.attention.base_attn_backend"
#: What SGLang calls on a backend that ours implements itself (the rest: the base class's defaults).
OURS = [
    "init_forward_metadata",
    "init_forward_metadata_out_graph",
    "init_forward_metadata_in_graph",
    "init_cuda_graph_state",
    "get_cuda_graph_seq_len_fill_value",
    "verify_mask",
    "update_verify_buffers_to_fill_after_draft",
    "forward_extend",
    "forward_decode",
]


@pytest.fixture(scope="module")
def sglang() -> Source:
    return Source(fetch_wheel())


def test_our_backend_has_sglang_s_methods_and_signatures(sglang):
    assert mismatches(VerifyMLABackend, sglang.cls(BASE, "AttentionBackend"), OURS) == []


def test_we_implement_every_abstract_method_and_set_only_declared_attributes(sglang):
    base = sglang.cls(BASE, "AttentionBackend")
    abstract = [n for n, fn in methods(base).items() if decorators(fn) & {"abstractmethod", "abc.abstractmethod"}]
    assert [n for n in abstract if n not in vars(VerifyMLABackend)] == []
    declared = {t.id for n in base.body if isinstance(n, ast.AnnAssign | ast.Assign) for t in _targets(n)}
    assert {"needs_cpu_seq_lens", "supports_ragged_verify_graph", "kv_index_translator"} <= declared


def _targets(node: ast.AST) -> list[ast.Name]:
    got = [node.target] if isinstance(node, ast.AnnAssign) else node.targets  # type: ignore[attr-defined]
    return [t for t in got if isinstance(t, ast.Name)]


def test_a_changed_signature_fails_the_contract(sglang):
    """Mutate SGLang's parsed base class as a release might: each change is named."""
    base = copy.deepcopy(sglang.cls(BASE, "AttentionBackend"))
    fns = methods(base)
    fns["init_forward_metadata_in_graph"].args.args[1].arg = "batch"  # a renamed parameter
    fns["init_forward_metadata_out_graph"].args.args.insert(2, ast.arg("plan"))  # a new required one
    fns["init_forward_metadata_out_graph"].args.defaults = []
    fns["forward_decode"].args.kwarg = None
    fns["forward_decode"].args.kwonlyargs.append(ast.arg("sinks"))  # a new keyword-only one
    fns["forward_decode"].args.kw_defaults.append(None)
    base.body.remove(fns["get_cuda_graph_seq_len_fill_value"])  # a method gone
    got = mismatches(VerifyMLABackend, base, OURS)
    print("\n".join(got))  # the messages a changed release gives (pytest -s shows them)
    assert got == [
        "AttentionBackend.init_forward_metadata_out_graph: SGLang passes 'plan', ours has no such parameter",
        "AttentionBackend.init_forward_metadata_out_graph: 'in_capture' is parameter 3 in SGLang, 2 in ours",
        "AttentionBackend.init_forward_metadata_in_graph: SGLang passes 'batch', ours has no such parameter",
        "AttentionBackend.init_forward_metadata_in_graph: ours requires ['forward_batch'], which SGLang does not pass",
        (
            "AttentionBackend.get_cuda_graph_seq_len_fill_value: SGLang 0.5.23 has no such method "
            "(ours: VerifyMLABackend.get_cuda_graph_seq_len_fill_value)"
        ),
        "AttentionBackend.forward_decode: SGLang passes 'sinks', ours has no such parameter",
    ]


def test_the_plugin_hooks_exist_as_the_plugin_uses_them(sglang):
    plugins = sglang.text("sglang.srt.plugins.__init__")
    assert 'GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"' in plugins
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["sglang.srt.plugins"]
    assert ours == {"verify_tuner": "verify_tuner.engine.sglang_plugin:register"}
    assert "add_attention_backend_choices = ATTENTION_BACKEND_CHOICES.extend" in sglang.text(
        "sglang.srt.arg_groups.choices"
    )
    registry = {fn.name: fn for fn in sglang.module("sglang.srt.layers.attention.attention_registry").body
                if isinstance(fn, ast.FunctionDef)}  # fmt: skip
    assert [a.arg for a in registry["register_attention_backend"].args.args] == ["name"]
    assert "FORWARD_ABSORB_CORE_ATTENTION_BACKENDS = [" in sglang.text("sglang.srt.models.deepseek_common.utils")
    assert sglang_plugin.NAME == "verify_tuner"


def test_absorbed_mla_layers_pass_q_rope_and_k_rope(sglang):
    """What registering the name among FORWARD_ABSORB_CORE_ATTENTION_BACKENDS buys: attn_mqa is
    called with the head-major q_nope and q_rope=, k_rope= keywords, which forward_extend takes."""
    mla = sglang.module("sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla")
    calls = [c for c in ast.walk(mla) if isinstance(c, ast.Call) and ast.unparse(c.func) == "self.attn_mqa"]
    kwargs = [{k.arg: ast.unparse(k.value) for k in c.keywords if k.arg} for c in calls]
    assert {"q_rope": "q_pe", "k_rope": "k_pe"} in [
        {k: v for k, v in kw.items() if k.endswith("rope")} for kw in kwargs
    ]
    text = sglang.text("sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla")
    assert "q_nope_out = q_nope_out.transpose(0, 1)" in text  # head-major: strides (512, T * 512, 1)


def test_the_tree_masks_and_the_verify_mask_are_as_we_read_them(sglang):
    modes = sglang.cls("sglang.kernels.ops.speculative.spec_tree", "TreeMaskMode")
    values = {t.id: ast.literal_eval(n.value) for n in modes.body if isinstance(n, ast.Assign) for t in _targets(n)}
    assert values == {m.name: int(m) for m in TreeMaskMode}
    verify = sglang.cls("sglang.srt.layers.attention.verify_mask", "VerifyMask")
    fields = [n.target.id for n in verify.body if isinstance(n, ast.AnnAssign)]
    assert fields == list(MaskSource.__dataclass_fields__) and "fits" in methods(verify)
    eagle = sglang.text("sglang.srt.speculative.eagle_worker_common")
    assert "mask_mode, fill_mask = verify_mask.mode, verify_mask.is_read" in eagle  # the draft writes in our mode
    assert "tree_mask_buf = verify_mask.buffer if verify_mask.fits(bs) else None" in eagle


def test_the_pool_the_runner_and_the_batch_have_what_we_read(sglang):
    pool = methods(sglang.cls("sglang.srt.mem_cache.memory_pool", "MLATokenToKVPool"))
    assert [a.arg for a in pool["get_key_buffer"].args.args] == ["self", "layer_id"]
    assert [a.arg for a in pool["set_mla_kv_buffer"].args.args][:5] == [
        "self",
        "layer",
        "loc_info",
        "cache_k_nope",
        "cache_k_rope",
    ]
    assert [a.arg for a in pool["set_kv_buffer"].args.args][:5] == ["self", "layer", "loc_info", "cache_k", "cache_v"]
    runner = sglang.text("sglang.srt.model_executor.model_runner")
    for attr in ("gpu_id", "model_config", "is_draft_worker", "page_size", "req_to_token_pool", "token_to_kv_pool",
                 "use_mla_backend", "kv_index_translator"):  # fmt: skip
        assert f"self.{attr} = " in runner, attr
    assert "def decode_num_tokens_per_req(" in runner
    # what a DP step's graph is keyed on: the runner's MLP-gather rule, the ranks' request counts
    assert "def decode_graph_gather_requirements(self) -> tuple[bool, bool]:" in runner
    graphs = sglang.text("sglang.srt.model_executor.runner.decode_cuda_graph_runner")
    assert "max_batch_size = self._max_dp_batch_size(forward_batch)" in graphs
    # an idle rank's replay: the view keeps the captured mode, the step's own in actual_forward_mode,
    # and its spec_info takes the runner's (all-ones) mask buffer
    assert "actual_forward_mode=forward_batch.forward_mode," in graphs
    assert "forward_batch.spec_info.custom_mask = buffers.custom_mask" in graphs
    # an eager verify's metadata is planned in its forward, after the mask update (none at prepare)
    eagle = sglang.text("sglang.srt.speculative.eagle_utils")
    assert "# Non-cuda-graph: defer init to forward_extend" in eagle
    # DFlash's and DSpark's verify raise the host lengths by the draft block for a backend that does
    # not add it itself (make_forward_metadata_from_raw_verify, which ours lacks)
    assert "verify_host_seq_lens = seq_lens_cpu_backup + block_size" in sglang.text(
        "sglang.srt.speculative.dflash_worker_v2"
    )
    dspark = sglang.text("sglang.srt.speculative.dspark_components.dspark_verify")
    assert "batch.seq_lens_cpu = seq_lens_cpu_backup + verify_w" in dspark
    assert 'hasattr(\n                backend, "make_forward_metadata_from_raw_verify"' in dspark
    assert not hasattr(VerifyMLABackend, "make_forward_metadata_from_raw_verify")
    # ragged verify: DSpark's alone, and only where the env asks for more than static lengths
    assert 'SGLANG_RAGGED_VERIFY_MODE = EnvStr("static")' in sglang.text("sglang.srt.environ")
    algo = methods(sglang.cls("sglang.srt.speculative.spec_info", "SpeculativeAlgorithm"))["supports_ragged_verify"]
    assert "return self.is_dspark()" in ast.unparse(algo)
    planner = sglang.text("sglang.srt.speculative.dspark_components.dspark_planner")
    assert "if self._ragged_verify_mode is RaggedVerifyMode.STATIC:\n            return None" in planner
    assert "request_counts = forward_batch.original_global_num_tokens_cpu" in graphs
    assert "self.is_translating = " in sglang.text("sglang.srt.mem_cache.kv_index_translator")
    batch = sglang.cls("sglang.srt.model_executor.forward_batch_info", "ForwardBatch")
    fields = {n.target.id for n in batch.body if isinstance(n, ast.AnnAssign)}
    assert {"forward_mode", "batch_size", "seq_lens", "req_pool_indices", "out_cache_loc", "spec_info",
            "original_global_num_tokens_cpu"} <= fields  # fmt: skip
    mode = methods(sglang.cls("sglang.srt.model_executor.forward_batch_info", "ForwardMode"))
    assert {"is_target_verify", "is_decode_or_idle", "is_decode", "is_idle"} <= set(mode)
    spec = sglang.text("sglang.srt.speculative.spec_info")
    assert "custom_mask: Optional[torch.Tensor] = None" in spec and "ragged_verify_layout: Optional" in spec
    for module in ("sglang.srt.speculative.eagle_info", "sglang.srt.speculative.dflash_info"):
        assert "draft_token_num: int" in sglang.text(module), module
    radix = sglang.text("sglang.srt.layers.radix_attention")
    assert all(f"self.{a} = " in radix for a in ("tp_q_head_num", "scaling", "layer_id"))


def test_the_triton_backend_and_the_helpers_the_plugin_builds_with(sglang):
    triton = methods(sglang.cls("sglang.srt.layers.attention.triton_backend", "TritonAttnBackend"))
    assert [a.arg for a in triton["__init__"].args.args][:2] == ["self", "model_runner"]
    assert [a.arg for a in triton["init_cuda_graph_state"].args.args][:3] == ["self", "max_bs", "max_num_tokens"]
    assert [a.arg for a in triton["forward_extend"].args.args][:7] == [
        "self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache",
    ]  # fmt: skip
    assert "def get_cuda_graph_max_batch_size(max_batch_size: int) -> int:" in sglang.text("sglang.srt.utils.common")
    assert "from sglang.srt.utils.common import *" in sglang.text("sglang.srt.utils.__init__")
    context = sglang.text("sglang.srt.runtime_context")
    assert "def get_parallel()" in context and '"attn_dcp_size"' in context and '"attn_tp_size"' in context
    # the TP group the first rank broadcasts its ranges over: get_parallel().tp_group, a GroupCoordinator
    state = sglang.text("sglang.srt.distributed.parallel_state")
    assert "def get_tp_group() -> GroupCoordinator:\n    return get_parallel().tp_group" in state
    for field in ("ranks: List[int]", "world_size: int", "rank_in_group: int", "cpu_group: ProcessGroup"):
        assert f"    {field}  #" in state, field


def test_graphs_per_prefix_range_go_through_sglang_s_attention_variants(sglang):
    """What the variants hook and VerifyMLABackend.graph_variants rely on: the plugin hook registry
    wraps a function AROUND (hook(original, *args)) and is applied after the plugins ran; the
    decode graph runner asks create_dsv41_candidate_graph_variants(model_runner, ...) for a model
    without its own variants, captures every label for every batch size with the label set (read
    back with get_capture_attention_variant) before the backend's capture hook, and replays the
    graph whose label `select(forward_batch)` gives, from the host lengths SGLang copies while the
    backend says needs_cpu_seq_lens."""
    from verify_tuner.engine.sglang_graphs import RangeVariants

    hooks = sglang.module("sglang.srt.plugins.hook_registry")
    registry = methods(next(n for n in hooks.body if isinstance(n, ast.ClassDef) and n.name == "HookRegistry"))
    assert [a.arg for a in registry["register"].args.args] == ["cls", "target", "hook", "hook_type"]
    kinds = sglang.cls("sglang.srt.plugins.hook_registry", "HookType")
    assert "AROUND" in {t.id for n in kinds.body if isinstance(n, ast.Assign) for t in _targets(n)}
    assert "return hook(original_fn, *args, **kwargs)" in sglang.text("sglang.srt.plugins.hook_registry")
    load = next(
        n for n in sglang.module("sglang.srt.plugins.__init__").body if getattr(n, "name", "") == "load_plugins"
    )
    steps = [ast.unparse(n) for n in load.body]
    ran = next(i for i, text in enumerate(steps) if text.startswith("for ") and "func()" in text)
    assert steps.index("HookRegistry.apply_hooks()") > ran  # the hooks apply after every plugin registered
    module, name = sglang_plugin.VARIANTS_HOOK.rsplit(".", 1)
    factory = next(n for n in sglang.module(module).body if isinstance(n, ast.FunctionDef) and n.name == name)
    assert [a.arg for a in factory.args.args] == ["model_runner", "capture_forward_mode", "captured_req_width"]
    protocol = sglang.cls(module, "AttentionGraphVariants")
    assert [a.arg for a in methods(protocol)["select"].args.args] == ["self", "forward_batch"]
    assert "capture_labels" in {n.target.id for n in protocol.body if isinstance(n, ast.AnnAssign)}
    assert {"capture_labels", "select"} <= {n for n in dir(RangeVariants) if not n.startswith("_")}
    runner = sglang.text("sglang.srt.model_executor.runner.decode_cuda_graph_runner")
    for fact in (
        "self.attn_backend = attn_backend or model_runner.attn_backend",
        f"or {name}(\n                model_runner, self.capture_forward_mode, self.captured_req_width\n            )",
        "return variants.select(forward_batch)",
        "variants.capture_labels if variants is not None else (None,)",
        "_set_capture_attention_variant(attention_variant)",
        "attn_backend.init_forward_metadata_out_graph(forward_batch, in_capture=True)",
    ):
        assert fact in runner, fact
    assert runner.index("_set_capture_attention_variant(attention_variant)") < runner.index(
        "attn_backend.init_forward_metadata_out_graph(forward_batch, in_capture=True)"
    )
    assert "def get_capture_attention_variant() -> Optional[str]:" in sglang.text(
        "sglang.srt.model_executor.runner_utils.capture_mode"
    )
    batch = sglang.cls("sglang.srt.model_executor.forward_batch_info", "ForwardBatch")
    assert "seq_lens_cpu" in {n.target.id for n in batch.body if isinstance(n, ast.AnnAssign)}
    assert "self.attn_backend = backends.attn_backend" in sglang.text("sglang.srt.model_executor.model_runner")
    overlap = sglang.text("sglang.srt.managers.overlap_utils")
    assert 'getattr(b, "needs_cpu_seq_lens", True) for b in attn_backends if b is not None' in overlap


def test_what_the_mask_layout_choice_and_the_read_ends_rest_on(sglang):
    """sglang_plugin.tree_mask_mode's facts: the runner's spec_algorithm answers the is_* it asks
    (a plugin-registered one too); NGRAM always writes the full-context mask; FROZEN_KV_MTP builds
    its tree with build_tree_kernel_efficient's default layout, the full-context one; STANDALONE goes
    through the EAGLE verify input that writes in the target backend's layout; UNO runs on FA3 only;
    DFlash's verify passes no mask. And the backend's declared read end: SharedReadEnds.POST_REPLAY,
    asked per mode through shared_read_ends(fm); a draft runner takes the plugin's factory only
    without a draft backend of its own."""
    asked = {"is_none", "is_ngram", "is_frozen_kv_mtp", "is_eagle", "is_standalone", "is_dflash_family"}
    assert asked <= set(methods(sglang.cls("sglang.srt.speculative.spec_info", "SpeculativeAlgorithm")))
    assert asked <= set(methods(sglang.cls("sglang.srt.speculative.spec_registry", "CustomSpecAlgo")))
    assert "self.spec_algorithm = SpeculativeAlgorithm.from_string(" in sglang.text(
        "sglang.srt.model_executor.model_runner"
    )
    assert "USE_FULL_MASK = True" in sglang.text("sglang.srt.speculative.ngram_worker")
    mtp = sglang.module("sglang.srt.speculative.frozen_kv_mtp_worker_v2")
    builds = [
        c for c in ast.walk(mtp) if isinstance(c, ast.Call) and ast.unparse(c.func) == "build_tree_kernel_efficient"
    ]
    assert builds and all("tree_mask_mode" not in {k.arg for k in c.keywords} for c in builds)
    assert "tree_mask_mode: TreeMaskMode = TreeMaskMode.FULL_MASK" in sglang.text("sglang.srt.speculative.eagle_utils")
    assert "UNO requires FA3 for both prefill and decode attention" in sglang.text(
        "sglang.srt.arg_groups.speculative_hook"
    )
    assert "class StandaloneWorkerV2(EAGLEWorkerV2):" in sglang.text("sglang.srt.speculative.standalone_worker_v2")
    assert "custom_mask = None" in sglang.text("sglang.srt.speculative.dflash_worker_v2")
    ends = sglang.cls(BASE, "SharedReadEnds")
    assert "POST_REPLAY" in {t.id for n in ends.body if isinstance(n, ast.Assign) for t in _targets(n)}
    assert [a.arg for a in methods(sglang.cls(BASE, "AttentionBackend"))["shared_read_ends"].args.args] == [
        "self",
        "fm",
    ]
    setup = sglang.text("sglang.srt.model_executor.model_runner_components.attention_backend_setup")
    assert "if is_draft_worker and draft_attn_backend:" in setup


def test_what_the_runner_checks_for_split_backends_overlap_and_adaptive_rest_on(sglang):
    """sglang_plugin._check_runner's facts: the runner stamps its resolved (prefill, decode) pair
    before building its backend; HybridAttnBackend runs target verify on the decode side only with
    --speculative-attention-mode decode, and _select_backend(mode) names the side (the variants hook
    asks it); the spec and exec bags hold the mode, adaptive and two-batch overlap; two-batch overlap
    splits a verify mask at full-context offsets."""
    runner = sglang.text("sglang.srt.model_executor.model_runner")
    stamp = runner.index("self.prefill_attention_backend_str = resolved.prefill")
    assert stamp < runner.index("backends = build_attention_backends(model_runner=self)")
    assert "self.decode_attention_backend_str = resolved.decode" in runner
    hybrid = sglang.text("sglang.srt.layers.attention.hybrid_attn_backend")
    assert 'self.spec_attn_is_decode = get_spec().speculative_attention_mode == "decode"' in hybrid
    select = methods(sglang.cls("sglang.srt.layers.attention.hybrid_attn_backend", "HybridAttnBackend"))[
        "_select_backend"
    ]
    assert [a.arg for a in select.args.args] == ["self", "forward_mode"]
    fields = sglang.text("sglang.srt.arg_groups.fields.spec")
    assert "speculative_attention_mode: A[" in fields and "speculative_adaptive: A[" in fields
    assert "enable_two_batch_overlap: A[" in sglang.text("sglang.srt.arg_groups.fields.exec_")
    assert "get_exec().overlap.enable_two_batch_overlap" in sglang.text(
        "sglang.srt.model_executor.model_runner_components.attention_backend_setup"
    )
    tbo = sglang.module("sglang.srt.batch_overlap.two_batch_overlap")
    offset = next(n for n in tbo.body if isinstance(n, ast.FunctionDef) and n.name == "_compute_mask_offset")
    assert "(spec_info.seq_lens_cpu[i] + spec_info.draft_token_num) * spec_info.draft_token_num" in ast.unparse(offset)
    # the metadata glue graph: an env flag the decode graph runner reads through envs (off by default)
    # the model-config field whose factor an absorbed-q backend is never handed
    assert 'getattr(config, "llama_4_scaling", None)' in sglang.text("sglang.srt.models.deepseek_v2")
    environ = sglang.text("sglang.srt.environ")
    assert "SGLANG_ENABLE_METADATA_GLUE_GRAPH = EnvBool(False)" in environ and "\nenvs = Envs()\n" in environ
    graphs = sglang.text("sglang.srt.model_executor.runner.decode_cuda_graph_runner")
    assert "envs.SGLANG_ENABLE_METADATA_GLUE_GRAPH.get()" in graphs
    # a speculative PD prefill node's target: no verify graphs, and a plain DECODE warm-up forward
    assert "\ndef get_disagg() -> _ConfigBag:" in sglang.text("sglang.srt.runtime_context")
    base = sglang.text("sglang.srt.model_executor.runner.base_runner")
    assert 'get_disagg().disaggregation_mode == "prefill" and not mr.is_draft_worker' in base
    assert "if mr.spec_algorithm.is_speculative() and not _is_pd_prefill_target:" in base
