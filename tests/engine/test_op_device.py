"""Which device the op launches on, without a GPU: a stand-in for cuda-python's driver module
records every call, so a tensor-parallel rank's op is seen to retain and use its own device's
primary context, read that device's limits and load the cubin built for its arch -- not device
0's. (tests/engine/test_op_gpu.py runs the real op; two devices need the x2 machine.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.engine import op
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.validate import smem_bytes

from tests.engine import fake_driver
from tests.engine.fake_driver import CFG  # fits both devices

BIG = KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3)  # 227 KB: the H200 only


@pytest.fixture
def driver(monkeypatch):
    fake = fake_driver.install(monkeypatch.setitem)
    built: list[tuple] = []
    monkeypatch.setattr(
        op, "_cubin", lambda cfg, q_len, arch, kv_dtype: built.append((cfg, q_len, arch)) or arch.encode()
    )
    monkeypatch.setattr(op, "_kernels", {})
    monkeypatch.setattr(op, "_limits", {})
    fake.built = built
    return fake


def test_a_rank_on_device_3_loads_into_device_3_s_context_for_its_arch(driver):
    kernels = op._kernels_for(3, CFG, 9, 8)
    assert ("cuDeviceGet", 3) in driver.calls and ("cuDeviceGet", 0) not in driver.calls
    assert driver.calls[-1] == ("cuModuleLoadData", "ctx3", b"sm_120")  # the cubin for device 3's arch
    assert driver.built == [(CFG, 9, "sm_120")] and kernels.sm_count == 188 and kernels.smem == smem_bytes(CFG, 9)


def test_each_device_gets_its_own_module_and_a_second_call_reuses_it(driver):
    on3 = op._kernels_for(3, CFG, 9, 8)
    on0 = op._kernels_for(0, CFG, 9, 8)
    assert on3 is not on0 and on3.module == "module@ctx3" and on0.module == "module@ctx0"
    assert op._kernels_for(3, CFG, 9, 8) is on3
    assert [c[2] for c in driver.calls if c[0] == "cuModuleLoadData"] == [b"sm_120", b"sm_90"]


def test_a_config_that_does_not_fit_the_rank_s_device_is_refused_before_loading(driver):
    from verify_tuner.kernels.errors import InvalidConfig

    driver.globals[b"kSmemBytes"] = smem_bytes(BIG, 9)
    op._kernels_for(0, BIG, 9, 8)
    with pytest.raises(InvalidConfig, match="shared memory"):
        op._kernels_for(3, BIG, 9, 8)
    assert [c[2] for c in driver.calls if c[0] == "cuModuleLoadData"] == [b"sm_90"]


def test_the_registered_op_reaches_its_own_checks_through_torch_s_dispatch():
    """Called as engines call it (every argument, workspace None): torch's dispatch must hand the
    call to the op, whose own check then refuses CPU tensors by name -- an op schema torch cannot
    dispatch (a mutated argument left to a default) fails before that with an IndexError."""
    B, Q, H = 2, 9, 8
    bf, i32 = {"dtype": torch.bfloat16}, {"dtype": torch.int32}
    args = (
        torch.zeros(B, Q, H, 576, **bf), None, torch.zeros(100, 576, **bf), torch.zeros(B + 1, **i32),
        torch.zeros(10, **i32), None, torch.zeros(B, Q, **i32), torch.zeros(B, Q, dtype=torch.int64),
        torch.zeros(B, Q, H, 512, **bf), None, op.config_list(CFG), 0.04, None,
    )  # fmt: skip
    with pytest.raises(ValueError, match="runs on a CUDA device"):
        torch.ops.verify_tuner.verify_attention(*args)
    with pytest.raises(ValueError, match="runs on a CUDA device"):
        torch.ops.verify_tuner.verify_attention(*args[:-1], torch.zeros(16, dtype=torch.uint8))


def test_a_launch_config_is_built_once_per_stream_and_batch_and_each_kernel_keeps_its_own(driver, monkeypatch):
    """runtime.CubinKernels keeps the cuda-python launch configs an engine's steps reuse (they cost
    more host time than the launch call): the same object for the same (stream, batch), another
    for another stream, and the partial's never the reduce's (its shared memory differs)."""
    from verify_tuner.kernels import runtime
    from verify_tuner.kernels.abi import LaunchSpec

    kernels = runtime.CubinKernels(b"cubin", LaunchSpec(CFG, 8, 9), sm_count=132)
    seen: list[tuple[bytes, object]] = []
    monkeypatch.setattr(
        driver, "cuLaunchKernelEx", lambda config, fn, args, extra: seen.append((fn[1], config)) or (0,)
    )
    ptrs = {"q": 1, "q_pe": None, "kv": 2, "prefix_indices": 3, "prefix_rows": 0, "prefix_indptr": 4,
            "draft_indices": 5, "tree_mask": 6, "out": 7, "lse": 0}  # fmt: skip
    for stream in (5, 5, 5, 6):
        kernels.launch(stream=stream, batch=2, pointers=ptrs, part_o=8, part_lse=9, softmax_scale=0.1)
    partial = [c for name, c in seen if name == b"verify_attn_partial"]
    reduce = [c for name, c in seen if name == b"verify_attn_reduce"]
    assert partial[0] is partial[1] is partial[2] and reduce[0] is reduce[1] is reduce[2]
    assert partial[3] is not partial[0] and (partial[3].hStream, partial[0].hStream) == (6, 5)
    assert partial[0].sharedMemBytes == kernels.smem and reduce[0].sharedMemBytes == 0


@pytest.mark.parametrize(("q_len", "declared", "pieces"), [(1, 16, 16), (9, 16, 4), (1, None, 4)])
def test_the_reduce_is_launched_with_the_pieces_its_cubin_allows(driver, monkeypatch, q_len, declared, pieces):
    """H=8 q=1 has 8 rows: the reduce cuts each into 16 pieces (verify_attn_reduce16, 128 blocks, not
    32) when the cubin declares kReduceMaxPieces 16; a cubin without it (v6's, which benchmarks
    launch through this runtime) merges quarters (verify_attn_reduce)."""
    from verify_tuner.kernels import runtime
    from verify_tuner.kernels.abi import REDUCE_ARGS, LaunchSpec

    from tests.engine.fake_driver import launch_values

    if declared is None:
        del driver.globals[b"kReduceMaxPieces"], driver.addresses[b"kReduceMaxPieces"]
    driver.globals[b"kSmemBytes"] = smem_bytes(CFG, q_len)
    kernels = runtime.CubinKernels(b"cubin", LaunchSpec(CFG, 8, q_len), sm_count=132)
    seen: list[tuple] = []
    monkeypatch.setattr(
        driver, "cuLaunchKernelEx", lambda config, fn, args, extra: seen.append((fn, config, args)) or (0,)
    )
    ptrs = {"q": 1, "q_pe": None, "kv": 2, "prefix_indices": 3, "prefix_rows": 0, "prefix_indptr": 4,
            "draft_indices": 5, "tree_mask": 6, "out": 7, "lse": 0}  # fmt: skip
    kernels.launch(stream=5, batch=1, pointers=ptrs, part_o=8, part_lse=9, softmax_scale=0.1)
    fn, config, args = seen[-1]
    assert fn[1] == (b"verify_attn_reduce16" if pieces == 16 else b"verify_attn_reduce")
    assert len(launch_values(fn, args)) == len(REDUCE_ARGS)
    assert config.gridDimX == q_len * 8 * pieces  # one item a block: every (row, piece) merges at once
