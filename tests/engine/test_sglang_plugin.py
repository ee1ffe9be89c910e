"""The SGLang plugin on the CPU, with stand-ins for the SGLang modules it touches (the names and
shapes test_sglang_contract.py checks against the released source): registering makes the name a
choice, a registered factory and an absorbed-q backend, once however often SGLang loads plugins;
the factory builds the backend over the runner's pool with the Triton backend as its delegate and
the config client's plan per batch size, and names what it cannot serve."""

from __future__ import annotations

import enum
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.engine import sglang_plugin
from verify_tuner.engine.sglang_backend import VerifyMLABackend
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.limits import known_device

from tests.engine.sglang_doubles import MLAPool


class AttentionBackend:
    """SGLang's base class, as far as the plugin needs it."""

    forward_metadata = None
    kv_index_translator = None


class TritonAttnBackend:
    extend_attention_block_m = 32  # the scheduler sizes prefill chunks by it

    def __init__(self, model_runner) -> None:
        self.runner = model_runner


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
    modules = {
        "sglang.srt.arg_groups.choices": {"ATTENTION_BACKEND_CHOICES": choices, "add_attention_backend_choices": choices.extend},
        "sglang.srt.layers.attention.attention_registry": {
            "ATTENTION_BACKENDS": registry,
            "register_attention_backend": lambda name: lambda fn: registry.__setitem__(name, fn) or fn,
        },
        "sglang.srt.models.deepseek_common.utils": {"FORWARD_ABSORB_CORE_ATTENTION_BACKENDS": absorbed},
        "sglang.srt.layers.attention.triton_backend": {"TritonAttnBackend": TritonAttnBackend},
        "sglang.srt.layers.attention.base_attn_backend": {"AttentionBackend": AttentionBackend},
        "sglang.srt.runtime_context": {"get_parallel": lambda: types.SimpleNamespace(attn_tp_size=8, attn_dcp_size=1)},
        "sglang.kernels.ops.speculative.spec_tree": {"TreeMaskMode": TreeMaskMode},
        "sglang.srt.utils": {"get_cuda_graph_max_batch_size": lambda n: -(-n // 8) * 8},
    }  # fmt: skip
    for name, attrs in modules.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))
    for var in ("VERIFY_TUNER_URL", "VERIFY_TUNER_CONFIG_DIR", "VERIFY_TUNER_CUBINS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H200")
    return types.SimpleNamespace(registry=registry, choices=choices, absorbed=absorbed)


def _runner(**over):
    runner = types.SimpleNamespace(
        is_draft_worker=False, use_mla_backend=True, page_size=1, gpu_id=0,
        kv_index_translator=types.SimpleNamespace(is_translating=False),
        model_config=types.SimpleNamespace(get_max_num_attention_heads=lambda: 64, context_len=8192),
        decode_num_tokens_per_req=lambda: 9,
        req_to_token_pool=types.SimpleNamespace(size=13, req_to_token=torch.zeros(13, 8192, dtype=torch.int32)),
        token_to_kv_pool=MLAPool(size=100, layers=1),
    )  # fmt: skip
    for k, v in over.items():
        setattr(runner, k, v)
    return runner


def test_registering_twice_adds_the_name_once(sglang):
    sglang_plugin.register()
    sglang_plugin.register()  # SGLang loads plugins in every process; a process may load them again
    assert sglang.choices.count("verify_tuner") == 1 and sglang.absorbed.count("verify_tuner") == 1
    assert sglang.registry["verify_tuner"] is sglang_plugin.create


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
    assert be.pick_config(9, 4) == want  # no sidecar, folder or snapshot: the client's heuristic
    be.init_cuda_graph_state(4, 36)
    assert be.verify_mask.buffer.numel() == 4 * 9 * 9 and be.workspace_bytes() > 0


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"use_mla_backend": False}, "runs MLA models"),
        ({"page_size": 64}, "pass --page-size 1"),
        ({"kv_index_translator": types.SimpleNamespace(is_translating=True)}, "a unified KV pool"),
    ],
)
def test_what_it_cannot_serve_is_named_at_startup(sglang, over, needle):
    with pytest.raises(ValueError, match=needle):
        sglang_plugin.create(_runner(**over))


def test_a_draft_model_s_runner_gets_the_triton_backend(sglang):
    be = sglang_plugin.create(_runner(is_draft_worker=True))
    assert type(be) is TritonAttnBackend


def test_a_device_without_configs_is_named(sglang, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Some Unknown GPU")
    with pytest.raises(RuntimeError, match="no kernel config for Some Unknown GPU"):
        sglang_plugin.create(_runner())
