"""The SGLang plugin on the CPU, with stand-ins for the SGLang modules it touches (the names and
shapes test_sglang_contract.py checks against the released source): registering makes the name a
choice, a registered factory and an absorbed-q backend, once however often SGLang loads plugins;
the factory builds the backend over the runner's pool with the Triton backend as its delegate and
the ranges of the config client's plan set per batch size, and names what it cannot serve; the
variants hook gives SGLang's graph runner a graph per prefix range for a runner on this backend."""

from __future__ import annotations

import dataclasses
import enum
import re
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.engine import sglang_plugin
from verify_tuner.engine.sglang_backend import VerifyMLABackend
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.limits import known_device

from tests.engine.sglang_doubles import MLAPool


class SharedReadEnds(enum.Enum):
    PRE_REPLAY = 1
    IN_REPLAY = 2
    POST_REPLAY = 3
    UNKNOWN = 4


class AttentionBackend:
    """SGLang's base class, as far as the plugin needs it."""

    forward_metadata = None
    kv_index_translator = None

    def shared_read_ends(self, fm):
        return SharedReadEnds.IN_REPLAY if fm.is_decode() or fm.is_target_verify() else SharedReadEnds.UNKNOWN


class SpeculativeAlgorithm:
    """SGLang's SpeculativeAlgorithm as the plugin reads it (is_eagle() includes FROZEN_KV_MTP, as
    SGLang's does; a plugin-registered algorithm answers False to every is_*)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"SpeculativeAlgorithm.{self.name}"

    def is_none(self):
        return self.name == "NONE"

    def is_eagle(self):
        return self.name in ("EAGLE", "EAGLE3", "FROZEN_KV_MTP")

    def is_frozen_kv_mtp(self):
        return self.name == "FROZEN_KV_MTP"

    def is_standalone(self):
        return self.name == "STANDALONE"

    def is_dflash_family(self):
        return self.name in ("DFLASH", "DSPARK")

    def is_ngram(self):
        return self.name == "NGRAM"

    def supports_ragged_verify(self):
        return self.name == "DSPARK"


class TritonAttnBackend:
    extend_attention_block_m = 32  # the scheduler sizes prefill chunks by it

    def __init__(self, model_runner) -> None:
        self.runner = model_runner


class HookType(enum.Enum):
    AROUND = "around"


class TreeMaskMode(enum.IntEnum):
    FULL_MASK = 0
    QLEN_ONLY = 1
    QLEN_ONLY_BITPACKING = 2


@pytest.fixture
def sglang(monkeypatch, tmp_path):
    """sglang's modules as the plugin imports them, a clean config-client environment, an H200."""
    registry: dict = {}
    choices = ["triton", "flashinfer"]
    absorbed = ["fa3", "flashinfer"]
    hooks: list = []
    capturing: list = [None]  # the attention variant SGLang's graph runner is capturing
    spec = types.SimpleNamespace(speculative_attention_mode="prefill", speculative_adaptive=False)
    execution = types.SimpleNamespace(overlap=types.SimpleNamespace(enable_two_batch_overlap=False))
    hook_registry = types.SimpleNamespace(register=lambda target, hook, kind: hooks.append((target, hook, kind)))
    # one rank alone; a test sets tp_group's rank and size (GroupCoordinator's fields) for several
    tp_group = types.SimpleNamespace(rank_in_group=0, world_size=1, ranks=[0], cpu_group="tp:cpu")
    parallel = types.SimpleNamespace(attn_tp_size=8, attn_dcp_size=1, tp_group=tp_group)
    glue = [False]  # SGLANG_ENABLE_METADATA_GLUE_GRAPH as SGLang's envs reads it
    disagg = types.SimpleNamespace(disaggregation_mode="null")  # PD disaggregation off
    ragged = ["static"]  # SGLANG_RAGGED_VERIFY_MODE
    envs = types.SimpleNamespace(
        SGLANG_ENABLE_METADATA_GLUE_GRAPH=types.SimpleNamespace(get=lambda: glue[0]),
        SGLANG_RAGGED_VERIFY_MODE=types.SimpleNamespace(get=lambda: ragged[0]),
    )
    modules = {
        "sglang.srt.arg_groups.choices": {"ATTENTION_BACKEND_CHOICES": choices, "add_attention_backend_choices": choices.extend},
        "sglang.srt.layers.attention.attention_registry": {
            "ATTENTION_BACKENDS": registry,
            "register_attention_backend": lambda name: lambda fn: registry.__setitem__(name, fn) or fn,
        },
        "sglang.srt.models.deepseek_common.utils": {"FORWARD_ABSORB_CORE_ATTENTION_BACKENDS": absorbed},
        "sglang.srt.layers.attention.triton_backend": {"TritonAttnBackend": TritonAttnBackend},
        "sglang.srt.layers.attention.base_attn_backend": {"AttentionBackend": AttentionBackend, "SharedReadEnds": SharedReadEnds},
        "sglang.srt.runtime_context": {
            "get_parallel": lambda: parallel,
            "get_spec": lambda: spec, "get_exec": lambda: execution, "get_disagg": lambda: disagg,
        },
        "sglang.kernels.ops.speculative.spec_tree": {"TreeMaskMode": TreeMaskMode},
        "sglang.srt.environ": {"envs": envs},
        "sglang.srt.utils": {"get_cuda_graph_max_batch_size": lambda n: -(-n // 8) * 8},
        "sglang.srt.plugins.hook_registry": {"HookRegistry": hook_registry, "HookType": HookType},
        "sglang.srt.model_executor.runner_utils.capture_mode": {"get_capture_attention_variant": lambda: capturing[0]},
    }  # fmt: skip
    for name, attrs in modules.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))
    for var in ("VERIFY_TUNER_URL", "VERIFY_TUNER_CONFIG_DIR", "VERIFY_TUNER_CUBINS", "VERIFY_TUNER_KV_DTYPE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H200")
    monkeypatch.setattr(sglang_plugin, "_hooked", False)
    return types.SimpleNamespace(
        registry=registry, choices=choices, absorbed=absorbed, hooks=hooks, capturing=capturing, spec=spec,
        execution=execution, tp_group=tp_group, glue=glue, disagg=disagg, ragged=ragged,
    )  # fmt: skip


#: Mistral-Large-3's model config: SGLang's absorbed-q path never hands the backend this factor
MISTRAL_LARGE_3 = types.SimpleNamespace(
    get_max_num_attention_heads=lambda: 128,
    context_len=8192,
    hf_config=types.SimpleNamespace(llama_4_scaling={"original_max_position_embeddings": 8192, "beta": 0.1}),
)


def _runner(**over):
    runner = types.SimpleNamespace(
        is_draft_worker=False, use_mla_backend=True, page_size=1, gpu_id=0,
        kv_index_translator=types.SimpleNamespace(is_translating=False),
        model_config=types.SimpleNamespace(get_max_num_attention_heads=lambda: 64, context_len=8192),
        decode_num_tokens_per_req=lambda: 9, decode_graph_gather_requirements=lambda: (False, False),
        req_to_token_pool=types.SimpleNamespace(size=13, req_to_token=torch.zeros(13, 8192, dtype=torch.int32)),
        token_to_kv_pool=MLAPool(size=100, layers=1), spec_algorithm=SpeculativeAlgorithm("EAGLE"),
        prefill_attention_backend_str="verify_tuner", decode_attention_backend_str="verify_tuner",
    )  # fmt: skip
    for k, v in over.items():
        setattr(runner, k, v)
    return runner


def test_registering_twice_adds_the_name_once(sglang):
    sglang_plugin.register()
    sglang_plugin.register()  # SGLang loads plugins in every process; a process may load them again
    assert sglang.choices.count("verify_tuner") == 1 and sglang.absorbed.count("verify_tuner") == 1
    assert sglang.registry["verify_tuner"] is sglang_plugin.create
    assert sglang.hooks == [(sglang_plugin.VARIANTS_HOOK, sglang_plugin.graph_variants, HookType.AROUND)]


def test_the_factory_builds_the_backend_over_the_runner_s_pool(sglang):
    sglang_plugin.register()
    runner = _runner()
    be = sglang.registry["verify_tuner"](runner)
    assert isinstance(be, VerifyMLABackend) and isinstance(be, AttentionBackend)
    assert isinstance(be.delegate, TritonAttnBackend) and be.delegate.runner is runner
    assert be.token_to_kv_pool is runner.token_to_kv_pool and be.req_to_token is runner.req_to_token_pool.req_to_token
    assert be.heads == 8 and sorted(be.steps) == [9] and be.max_bs == 16  # the pool's 13, graph-aligned
    assert be.kv_index_translator is runner.kv_index_translator and be.tree_mask_mode == TreeMaskMode.QLEN_ONLY
    assert be.extend_attention_block_m == 32  # prefill runs on the Triton backend: its tile
    want = heuristic_config(known_device("h200"), H=8, q_len=9, prefix=8192, batch=4)
    assert be.graphs.configs(9, 4) == (want,)  # no sidecar, folder or snapshot: the client's heuristic
    be.init_cuda_graph_state(4, 36)
    assert be.verify_mask.buffer.numel() == 4 * 9 * 9 and be.workspace_bytes() > 0
    assert be.graph_variants() is None and not be.needs_cpu_seq_lens  # one graph per batch size, no lengths read
    assert not be.dp_graph_batch  # no DP attention: a step's own batch size keys its graph
    dp = sglang.registry["verify_tuner"](_runner(decode_graph_gather_requirements=lambda: (True, False)))
    assert dp.dp_graph_batch  # the runner's MLP gather: the largest DP rank's batch keys every rank's graph


@pytest.mark.parametrize(("mode", "spec", "decodes"), [("prefill", "EAGLE", False), ("prefill", "NONE", True),
                                                        ("decode", "EAGLE", True), ("null", "EAGLE", True)])  # fmt: skip
def test_only_a_speculative_pd_prefill_node_hands_its_decode_to_triton(sglang, mode, spec, decodes):
    """Its target decodes only SGLang's flashinfer-autotune warm-up, at q_len 1, which a verify
    backend has no configs for; without speculation q_len 1 is the backend's own step."""
    sglang_plugin.register()
    sglang.disagg.disaggregation_mode = mode
    be = sglang.registry["verify_tuner"](_runner(spec_algorithm=SpeculativeAlgorithm(spec)))
    assert be.decodes is decodes


@pytest.mark.parametrize(("spec", "mode", "refused"), [("DSPARK", "compact", True), ("DSPARK", "cap-accept", True),
                                                       ("DSPARK", "static", False), ("EAGLE", "compact", False)])  # fmt: skip
def test_dspark_s_ragged_verify_is_refused_at_startup(sglang, spec, mode, refused):
    """Per-request draft lengths would stop the server at its first ragged step: said at startup."""
    sglang_plugin.register()
    sglang.ragged[0] = mode
    runner = _runner(spec_algorithm=SpeculativeAlgorithm(spec))
    if refused:
        with pytest.raises(ValueError, match=f"SGLANG_RAGGED_VERIFY_MODE={mode} gives DSPARK per-request lengths"):
            sglang.registry["verify_tuner"](runner)
    else:
        assert isinstance(sglang.registry["verify_tuner"](runner), VerifyMLABackend)


@pytest.mark.parametrize(("spec", "ahead"), [("DFLASH", True), ("DSPARK", True), ("EAGLE", False), ("NONE", False)])
def test_dflash_and_dspark_hand_host_lengths_with_the_draft_block(sglang, spec, ahead):
    sglang_plugin.register()
    be = sglang.registry["verify_tuner"](_runner(spec_algorithm=SpeculativeAlgorithm(spec)))
    assert be.graphs.host_counts_draft is ahead


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"use_mla_backend": False}, "runs MLA models"),
        ({"page_size": 64}, "pass --page-size 1"),
        ({"kv_index_translator": types.SimpleNamespace(is_translating=True)}, "a unified KV pool"),
        ({"model_config": MISTRAL_LARGE_3}, "cannot apply this model's llama_4_scaling"),
    ],
)
def test_what_it_cannot_serve_is_named_at_startup(sglang, over, needle):
    with pytest.raises(ValueError, match=needle):
        sglang_plugin.create(_runner(**over))


def test_a_draft_runner_without_a_backend_of_its_own_is_told_to_name_one(sglang):
    """SGLang builds a draft runner's backend from --speculative-draft-attention-backend; without it
    the draft runner asks this factory, whose Triton backend under this name would be handed
    q_rope/k_rope keywords Triton does not take (and the draft stage knows no such backend)."""
    with pytest.raises(ValueError, match="pass --speculative-draft-attention-backend triton for the draft model"):
        sglang_plugin.create(_runner(is_draft_worker=True))


@pytest.mark.parametrize(
    ("algorithm", "mode"),
    [("EAGLE", "QLEN_ONLY"), ("EAGLE3", "QLEN_ONLY"), ("STANDALONE", "QLEN_ONLY"),
     ("DFLASH", "QLEN_ONLY"), ("DSPARK", "QLEN_ONLY"), ("NONE", "QLEN_ONLY"),
     ("NGRAM", "FULL_MASK"), ("FROZEN_KV_MTP", "FULL_MASK")],
)  # fmt: skip
def test_the_verify_mask_layout_follows_the_speculative_algorithm(sglang, algorithm, mode):
    """NGRAM and FROZEN_KV_MTP write full-context masks whatever the backend's verify_mask asks for
    (read as q_len x q_len cells they gave attention 0.71 off, without an error); the EAGLE family
    writes in the backend's layout; DFlash and DSpark verify chains."""
    be = sglang_plugin.create(_runner(spec_algorithm=SpeculativeAlgorithm(algorithm)))
    assert be.tree_mask_mode == TreeMaskMode[mode]
    be.init_cuda_graph_state(4, 36)
    cells = 4 * 9 * (8192 + 9) if mode == "FULL_MASK" else 4 * 9 * 9  # SGLang's own buffer for the layout
    assert be.verify_mask.mode == TreeMaskMode[mode] and be.verify_mask.buffer.numel() == cells


def test_an_algorithm_whose_mask_layout_is_unknown_is_refused(sglang):
    """A plugin-registered algorithm (and UNO, which SGLang itself runs only on FA3) answers False
    to every is_* the layout is chosen by."""
    for name in ("MYSPEC", "UNO"):
        with pytest.raises(
            ValueError, match=rf"verify mask layout of speculative algorithm SpeculativeAlgorithm.{name}"
        ):
            sglang_plugin.create(_runner(spec_algorithm=SpeculativeAlgorithm(name)))


@pytest.mark.parametrize(
    ("prefill", "decode", "mode", "algorithm", "needle"),
    [
        ("fa3", "verify_tuner", "prefill", "EAGLE", ("--decode-attention-backend verify_tuner: target verify runs on the "
         "fa3 backend with --speculative-attention-mode prefill; pass --speculative-attention-mode decode")),
        ("verify_tuner", "fa3", "decode", "EAGLE", ("--prefill-attention-backend verify_tuner: target verify runs on the "
         "fa3 backend with --speculative-attention-mode decode; pass --speculative-attention-mode prefill")),
        ("verify_tuner", "fa3", "prefill", "NONE", "--prefill-attention-backend verify_tuner runs nothing"),
        ("fa3", "verify_tuner", "decode", "EAGLE", None),
        ("verify_tuner", "fa3", "prefill", "EAGLE", None),
        ("fa3", "verify_tuner", "prefill", "NONE", None),
    ],
)  # fmt: skip
def test_split_prefill_and_decode_backends_must_leave_this_one_something_to_run(
    sglang, prefill, decode, mode, algorithm, needle
):
    """--prefill-attention-backend / --decode-attention-backend apart: SGLang's HybridAttnBackend runs
    decode on the decode side and target verify on the prefill side unless --speculative-attention-mode
    decode. Where this backend would run neither, the kernel would silently never run: refused."""
    sglang.spec.speculative_attention_mode = mode
    runner = _runner(
        prefill_attention_backend_str=prefill, decode_attention_backend_str=decode,
        spec_algorithm=SpeculativeAlgorithm(algorithm),
    )  # fmt: skip
    if needle is None:
        assert isinstance(sglang_plugin.create(runner), VerifyMLABackend)
    else:
        with pytest.raises(ValueError, match=re.escape(needle)):
            sglang_plugin.create(runner)


def test_what_splits_or_switches_a_verify_step_is_refused_with_speculative_decoding(sglang):
    """Two-batch overlap splits the verify mask at full-context offsets (our layout is q_len x
    q_len); --speculative-adaptive builds backends for other draft lengths than the one a backend
    serves. Both are refused with speculative decoding; without it they are not this backend's concern."""
    sglang.execution.overlap.enable_two_batch_overlap = True
    with pytest.raises(ValueError, match="does not run two-batch overlap"):
        sglang_plugin.create(_runner())
    assert isinstance(sglang_plugin.create(_runner(spec_algorithm=SpeculativeAlgorithm("NONE"))), VerifyMLABackend)
    sglang.execution.overlap.enable_two_batch_overlap = False
    sglang.spec.speculative_adaptive = True
    with pytest.raises(ValueError, match="serves one draft length a server: --speculative-adaptive"):
        sglang_plugin.create(_runner())


def test_the_variants_hook_finds_this_backend_inside_sglang_s_hybrid_backend(sglang):
    """With split backends SGLang's graph runner holds a HybridAttnBackend; the hook asks it for
    the backend of the mode being captured (its _select_backend), so a verify graph still gets
    this backend's prefix ranges."""
    be = sglang_plugin.create(_runner())
    ours = types.SimpleNamespace(capture_labels=("0", "1"))
    be.graph_variants = lambda: ours
    hybrid = types.SimpleNamespace(_select_backend=lambda mode: be if mode == "TARGET_VERIFY" else None)
    runner = types.SimpleNamespace(attn_backend=hybrid, is_draft_worker=False)
    assert sglang_plugin.graph_variants(lambda *a: "sglang's", runner, "TARGET_VERIFY", 9) is ours
    assert sglang_plugin.graph_variants(lambda *a: "sglang's", runner, "DECODE", 1) == "sglang's"


def test_the_backend_s_shared_reads_end_after_the_replay(sglang):
    """The kernel reads the scheduler's req_to_token in every layer: decode and verify declare their
    shared reads ended only after the replay; other modes (Triton's) keep SGLang's default."""
    be = sglang_plugin.create(_runner())
    mode = lambda name: types.SimpleNamespace(
        is_decode=lambda: name == "decode", is_target_verify=lambda: name == "verify"
    )
    assert be.shared_read_ends(mode("decode")) is SharedReadEnds.POST_REPLAY
    assert be.shared_read_ends(mode("verify")) is SharedReadEnds.POST_REPLAY
    assert be.shared_read_ends(mode("extend")) is SharedReadEnds.UNKNOWN


def test_a_device_without_configs_is_named(sglang, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Some Unknown GPU")
    with pytest.raises(RuntimeError, match="no kernel config for Some Unknown GPU"):
        sglang_plugin.create(_runner())


def _broadcast_from(monkeypatch, sent: list, first_ranks=None):
    """torch.distributed.broadcast_object_list as a rank sees it: the first rank's object is recorded
    in `sent` (its group and source too); another rank receives `first_ranks`."""
    import torch.distributed as dist

    def broadcast(box, src, group):
        sent.append((box[0], src, group))
        if first_ranks is not None:
            box[0] = first_ranks

    monkeypatch.setattr(dist, "broadcast_object_list", broadcast)


def test_every_tensor_parallel_rank_takes_the_first_rank_s_ranges(sglang, monkeypatch, tmp_path):
    """SGLang captures a graph per range label on every TP rank, with collectives in each capture: a
    rank whose sidecar fetch timed out (the heuristic, one range) beside one that got a two-range
    table would capture different counts and hang. The first rank fetches and broadcasts its
    ranges for every batch size; the others fetch nothing and capture exactly those."""
    from verify_tuner.engine import client as client_mod

    from tests.engine.test_client_faults import _two_ranges, engine_doc, write_engine_file

    short, long = _two_ranges()
    write_engine_file(tmp_path / "cfg", engine_doc() | {"graph_plan_ranges": {"1": [short, long]}})
    monkeypatch.setenv("VERIFY_TUNER_CONFIG_DIR", str(tmp_path / "cfg"))
    sglang_plugin.register()
    sent: list = []
    _broadcast_from(monkeypatch, sent)
    sglang.tp_group.world_size, sglang.tp_group.ranks = 2, [4, 5]  # a second TP group: global ranks 4, 5
    first = sglang.registry["verify_tuner"](_runner())
    ((plans, src, group),) = sent
    assert (src, group) == (4, "tp:cpu") and sorted(plans[1]) == list(range(1, 17))  # B=1..16, the pool's
    assert len(first.graphs.configs(9, 1)) == 2
    # the second rank: its own fetch would be the heuristic's one range (no config dir); it fetches nothing
    monkeypatch.delenv("VERIFY_TUNER_CONFIG_DIR")
    monkeypatch.setattr(
        client_mod.ConfigClient, "fetch", lambda self: pytest.fail("a rank other than the first fetched")
    )
    sglang.tp_group.rank_in_group = 1
    _broadcast_from(monkeypatch, [], first_ranks=plans)
    second = sglang.registry["verify_tuner"](_runner())
    for bs in (1, 4, 16):
        assert second.graphs.configs(9, bs) == first.graphs.configs(9, bs)
    with pytest.raises(ValueError, match="batch 17 outside 1..16"):
        second.graphs.configs(9, 17)


@pytest.mark.parametrize("algorithm", ["NGRAM", "FROZEN_KV_MTP", "EAGLE"])
def test_the_metadata_glue_graph_is_refused_where_each_step_allocates_its_mask(sglang, algorithm):
    """SGLANG_ENABLE_METADATA_GLUE_GRAPH captures each step's metadata prep once and replays it: the
    backend's copy of a mask NGRAM or FROZEN_KV_MTP allocates afresh every step would keep reading
    the first step's buffer. EAGLE writes into the backend's own buffer, which the glue keeps."""
    sglang.glue[0] = True
    runner = _runner(spec_algorithm=SpeculativeAlgorithm(algorithm))
    if algorithm == "EAGLE":
        assert isinstance(sglang_plugin.create(runner), VerifyMLABackend)
        return
    with pytest.raises(ValueError, match=f"with {algorithm} verify masks cannot run under SGLANG_ENABLE_METADATA_GLUE"):
        sglang_plugin.create(runner)
    sglang.glue[0] = False
    assert isinstance(sglang_plugin.create(runner), VerifyMLABackend)


def _unknown_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Some Unknown GPU")


def _broken_client(monkeypatch):
    from verify_tuner.engine import client as client_mod

    def broken(*args, **kwargs):
        raise OSError("config dir unreadable")

    monkeypatch.setattr(client_mod, "ConfigClient", broken)


@pytest.mark.parametrize(
    ("break_first", "first_error", "needle", "reason_is"),
    [
        (_unknown_gpu, RuntimeError, "no kernel config for Some Unknown GPU", "device 'Some Unknown GPU' is unknown"),
        (_broken_client, OSError, "config dir unreadable", "the first TP rank failed: OSError: config dir unreadable"),
    ],
)
def test_a_first_rank_that_fails_stops_every_rank_with_its_reason(
    sglang, monkeypatch, break_first, first_error, needle, reason_is
):
    """The first rank broadcasts its failure -- no config for the device, or an error in its fetch,
    raised there with its own traceback -- before it raises, so the other ranks stop with the reason
    instead of waiting for ranges that never come."""
    break_first(monkeypatch)
    sglang_plugin.register()
    sent: list = []
    _broadcast_from(monkeypatch, sent)
    sglang.tp_group.world_size, sglang.tp_group.ranks = 2, [0, 1]
    with pytest.raises(first_error, match=needle):
        sglang_plugin.create(_runner())
    (((reason, table), _, _),) = sent
    assert table is None and reason.startswith(reason_is)
    sglang.tp_group.rank_in_group = 1
    _broadcast_from(monkeypatch, [], first_ranks=(reason, None))
    with pytest.raises(RuntimeError, match=re.escape(reason)):
        sglang_plugin.create(_runner())


def test_a_plan_set_of_two_ranges_becomes_two_graphs_per_batch_size(sglang, monkeypatch, tmp_path):
    """A `tuner configs dump` folder with B=1's set split at 4096: the backend picks both ranges, asks
    SGLang for host lengths, and the hook hands SGLang's graph runner its variants (a runner on any
    other backend, or a draft runner, gets SGLang's own); each capture takes its label's config."""
    from tests.engine.test_client_faults import _two_ranges, engine_doc, write_engine_file

    short, long = _two_ranges()
    write_engine_file(tmp_path / "cfg", engine_doc() | {"graph_plan_ranges": {"1": [short, long]}})
    monkeypatch.setenv("VERIFY_TUNER_CONFIG_DIR", str(tmp_path / "cfg"))
    sglang_plugin.register()
    runner = _runner()
    be = sglang.registry["verify_tuner"](runner)
    (_, cfg_short), (start, cfg_long) = be.graphs.pick(9, 1)
    assert (cfg_short.nsplit, start, cfg_long.nsplit) == (64, 4096, long["NSPLIT"]) and be.needs_cpu_seq_lens
    assert len(be.graphs.configs(9, 8)) == 1  # no set for B=5..8: one range, the table's longest-prefix config
    runner.attn_backend = be
    original = lambda model_runner, mode, width=0: ("sglang's own", mode)
    variants = sglang_plugin.graph_variants(original, runner, "TARGET_VERIFY", 9)
    assert variants is be.graph_variants()
    be.init_cuda_graph_state(4, 36)
    assert variants.capture_labels == ("prefix_range_0", "prefix_range_1")
    other = types.SimpleNamespace(attn_backend=TritonAttnBackend(runner), is_draft_worker=False)
    assert sglang_plugin.graph_variants(original, other, "TARGET_VERIFY", 9) == ("sglang's own", "TARGET_VERIFY")
    draft = types.SimpleNamespace(attn_backend=be, is_draft_worker=True)
    assert sglang_plugin.graph_variants(original, draft, "TARGET_VERIFY", 9)[0] == "sglang's own"
    from verify_tuner.engine import op

    from tests.engine.sglang_doubles import ForwardBatch, ForwardMode, SpecInfo

    fb = ForwardBatch(ForwardMode.TARGET_VERIFY, 1, torch.ones(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64),
                      torch.zeros(9, dtype=torch.int64), SpecInfo(torch.ones(81, dtype=torch.bool), 9, 4))  # fmt: skip
    for text, want in (("prefix_range_1", cfg_long), ("prefix_range_0", cfg_short)):
        sglang.capturing[0] = text  # what SGLang's runner sets before each capture
        be.init_forward_metadata_out_graph(fb, in_capture=True)
        assert be._current[2] == op.config_list(want)  # the config the graph records


def test_an_e4m3_pool_is_served_its_own_formats_configs(sglang, monkeypatch, tmp_path):
    """SGLang's --kv-cache-dtype fp8_e4m3 pool (uint8 storage): the backend reads it as fp8_e4m3 and
    its configs come from that format's table, not bf16's (both files in the folder)."""
    from verify_tuner.engine_files import file_name, write_atomic

    from tests.engine.test_client_faults import TABLE, engine_doc, write_engine_file

    folder = tmp_path / "cfg"
    write_engine_file(folder, engine_doc())  # bf16: the heuristic's configs
    fp8 = engine_doc() | {"dtype": "fp8_e4m3"}
    fp8["configs"] = {b: [e | {"NSPLIT": 66} for e in es] for b, es in fp8["configs"].items()}
    write_atomic(folder / file_name(dataclasses.replace(TABLE, kv_dtype="fp8_e4m3")), fp8)
    monkeypatch.setenv("VERIFY_TUNER_CONFIG_DIR", str(folder))
    sglang_plugin.register()
    runner = _runner(model_config=types.SimpleNamespace(get_max_num_attention_heads=lambda: 64, context_len=8192))
    runner.token_to_kv_pool = MLAPool(size=100, layers=1, dtype=torch.uint8)
    be = sglang.registry["verify_tuner"](runner)
    assert be.kv_dtype == "fp8_e4m3"
    assert {c.nsplit for c in be.graphs.configs(9, 4)} == {66}  # the e4m3 table's
    runner.token_to_kv_pool = MLAPool(size=100, layers=1)  # a bf16 pool on the same folder: bf16's table
    be16 = sglang.registry["verify_tuner"](runner)
    assert be16.kv_dtype == "bf16" and 66 not in {c.nsplit for c in be16.graphs.configs(9, 4)}


def test_the_operator_picks_the_qk_mode_and_its_table_answers(sglang, monkeypatch, tmp_path):
    """VERIFY_TUNER_KV_DTYPE=fp8_e4m3_qk on SGLang's e4m3 pool: the backend computes QK on e4m3 MMAs
    and its configs come from that mode's table, not from the fp8_e4m3 or bf16 ones beside it."""
    from verify_tuner.engine_files import file_name, write_atomic

    from tests.engine.test_client_faults import TABLE, engine_doc, write_engine_file

    folder = tmp_path / "cfg"
    write_engine_file(folder, engine_doc())
    for kv, nsplit in (("fp8_e4m3", 66), ("fp8_e4m3_qk", 33)):
        doc = engine_doc() | {"dtype": kv}
        doc["configs"] = {b: [e | {"NSPLIT": nsplit} for e in es] for b, es in doc["configs"].items()}
        write_atomic(folder / file_name(dataclasses.replace(TABLE, kv_dtype=kv)), doc)
    monkeypatch.setenv("VERIFY_TUNER_CONFIG_DIR", str(folder))
    monkeypatch.setenv("VERIFY_TUNER_KV_DTYPE", "fp8_e4m3_qk")
    sglang_plugin.register()
    runner = _runner(model_config=types.SimpleNamespace(get_max_num_attention_heads=lambda: 64, context_len=8192))
    runner.token_to_kv_pool = MLAPool(size=100, layers=1, dtype=torch.uint8)
    be = sglang.registry["verify_tuner"](runner)
    assert be.kv_dtype == "fp8_e4m3_qk" and {c.nsplit for c in be.graphs.configs(9, 4)} == {33}


@pytest.mark.parametrize(
    ("env", "pool_dtype", "needle"),
    [
        ("fp8_ds_mla", torch.uint8, r"kv_dtype fp8_ds_mla reads 656-byte rows \(.*\), SGLang's MLA pool holds 576"),
        ("fp8_e4m3", torch.bfloat16, r"kv_dtype fp8_e4m3 reads a pool of uint8 or float8_e4m3fn, this one holds"),
        ("bf16", torch.uint8, r"kv_dtype bf16 reads a pool of bfloat16, this one holds torch.uint8"),
        ("fp8", torch.uint8, r"unknown kv_dtype 'fp8': one of bf16, fp8_e4m3"),
    ],
)
def test_the_operators_kv_dtype_is_checked_against_the_pool_at_startup(sglang, monkeypatch, env, pool_dtype, needle):
    """VERIFY_TUNER_KV_DTYPE picks how the kernel computes on the pool (e.g. fp8_e4m3_qk); a format
    the kernel does not read, or one the pool cannot hold (a dtype, or FlashMLA's 656-byte rows on
    the 576-wide MLA pool), stops the server starting with one line that names the setting."""
    monkeypatch.setenv("VERIFY_TUNER_KV_DTYPE", env)
    sglang_plugin.register()
    runner = _runner()
    runner.token_to_kv_pool = MLAPool(size=100, layers=1, dtype=pool_dtype)
    with pytest.raises(NotImplementedError, match=f"^VERIFY_TUNER_KV_DTYPE={env}: .*{needle}") as err:
        sglang.registry["verify_tuner"](runner)
    assert "\n" not in str(err.value)


def test_a_mode_the_gpu_cannot_run_is_refused_at_startup(sglang, monkeypatch):
    """fp8_e4m3_qk on an A100 (no e4m3 MMAs) is refused by name when the server starts, not when
    a graph is captured."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setenv("VERIFY_TUNER_KV_DTYPE", "fp8_e4m3_qk")
    sglang_plugin.register()
    runner = _runner()
    runner.token_to_kv_pool = MLAPool(size=100, layers=1, dtype=torch.uint8)
    with pytest.raises(NotImplementedError, match="fp8_e4m3_qk needs compute capability 8.9.*has 8.0"):
        sglang.registry["verify_tuner"](runner)
