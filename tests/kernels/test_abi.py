"""The op's checks of its tensors (kernels/abi.py: torch-free, so they run here) and the launch
arithmetic both loaders share."""

from __future__ import annotations

import pytest
from verify_tuner.kernels.abi import LaunchSpec, TensorMeta, check_call, reduce_grid
from verify_tuner.kernels.config import KernelConfig

B, Q, H = 4, 9, 8


def _good(**over):
    d = "cuda:1"
    t = {
        "q": TensorMeta("bfloat16", (B, Q, H, 576), d, True),
        "kv": TensorMeta("bfloat16", (5000, 576), d, True),
        "kv_indptr": TensorMeta("int32", (B + 1,), d, True),
        "kv_indices": TensorMeta("int32", (4000,), d, True),
        "draft_slots": TensorMeta("int32", (B, Q), d, True),
        "tree_mask": TensorMeta("int64", (B, Q), d, True),
        "out": TensorMeta("bfloat16", (B, Q, H, 512), d, True),
        "lse": TensorMeta("float32", (B, Q, H), d, True),
    }
    t.update(over)
    return t


def test_a_well_formed_call_passes_on_any_cuda_device():
    assert check_call(_good(), q_len=Q, H=H) is None
    assert check_call(_good(lse=None), q_len=Q, H=H) is None


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"q": TensorMeta("float16", (B, Q, H, 576), "cuda:1", True)}, "q must be bfloat16"),
        ({"kv_indptr": TensorMeta("int64", (B + 1,), "cuda:1", True)}, "kv_indptr must be int32"),
        ({"tree_mask": TensorMeta("int32", (B, Q), "cuda:1", True)}, "tree_mask must be int64"),
        ({"out": TensorMeta("bfloat16", (B, Q, H, 576), "cuda:1", True)}, "out must be [4, 9, 8, 512]"),
        ({"kv_indptr": TensorMeta("int32", (B,), "cuda:1", True)}, "kv_indptr must be [5]"),
        ({"kv": TensorMeta("bfloat16", (5000, 512), "cuda:1", True)}, "kv must be [*, 576]"),
        ({"lse": TensorMeta("float32", (B, Q), "cuda:1", True)}, "lse must be [4, 9, 8]"),
        ({"lse": TensorMeta("bfloat16", (B, Q, H), "cuda:1", True)}, "lse must be float32"),
        ({"kv": TensorMeta("bfloat16", (5000, 576), "cuda:0", True)}, "kv is on cuda:0, q on cuda:1"),
        ({"draft_slots": TensorMeta("int32", (B, Q), "cuda:1", False)}, "draft_slots must be contiguous"),
        ({"out": None}, "out is required"),
    ],
)
def test_each_mistake_is_named(over, needle):
    reason = check_call(_good(**over), q_len=Q, H=H)
    assert reason is not None and needle in reason, reason


def test_cpu_tensors_are_refused():
    cpu = {k: TensorMeta(m.dtype, m.shape, "cpu", True) for k, m in _good().items()}
    assert "CUDA device" in check_call(cpu, q_len=Q, H=H)


def test_q_len_and_heads_come_from_q():
    assert "q must be [B, 16, 8, 576]" in check_call(_good(), q_len=16, H=H)


def test_the_grid_is_the_same_for_every_batch_and_the_workspace_follows_the_plan():
    spec = LaunchSpec(KernelConfig(nsplit=132, ht=4, tk=32, block=256, qt=3), H=8, q_len=9)
    assert spec.partial_grid() == (132, 2 * 3, 1)
    assert spec.workspace_rows(1) == 132 * 9 * 8 and spec.workspace_rows(32) == (132 + 31) * 9 * 8


@pytest.mark.parametrize("batch", [1, 2, 8, 32, 256, 4096])
def test_reduce_grid_covers_every_item_within_a_block_s_threads(batch):
    blocks, per = reduce_grid(batch=batch, q_len=9, H=8, sm_count=132, threads=256)
    items = batch * 9 * 8 * 4
    assert blocks * per >= items and per <= 256 and blocks <= max(items, 1)
    if batch == 1:
        assert per == 1  # one long request: every item its own block
