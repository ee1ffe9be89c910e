"""The op's host path on the CPU (cuda-python's driver stood in, launches accepted but not run):
a call checks its tensors once per signature and then pays only for its addresses and the launch;
a call of any other signature -- another shape, dtype, alignment or workspace -- is checked again,
so a cached plan never lets a bad call through."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.engine import op
from verify_tuner.kernels import abi

from tests.engine import fake_driver
from tests.engine.fake_driver import CFG

H, Q = 8, 9


@pytest.fixture
def host(monkeypatch):
    fake = fake_driver.host_only(monkeypatch.setattr, monkeypatch.setitem)
    checks = []
    layout = op.call_layout
    monkeypatch.setattr(op, "call_layout", lambda *a, **k: checks.append(a[0]["q"].shape) or layout(*a, **k))
    fake.checks = checks
    return fake


def _args(B: int, *, q_dtype=torch.bfloat16, workspace=None, offset: int = 0):
    bf, i32 = {"dtype": torch.bfloat16}, {"dtype": torch.int32}
    q = torch.zeros(B * Q * H * 576 + 8, dtype=q_dtype)[offset : offset + B * Q * H * 576].view(B, Q, H, 576)
    return (
        q, None, torch.zeros(100, 576, **bf), torch.zeros(B + 1, **i32), torch.zeros(50, **i32), None,
        torch.zeros(B, Q, **i32), torch.zeros(B, Q, dtype=torch.int64), torch.zeros(B, Q, H, 512, **bf), None,
        op.config_list(CFG), 0.1447, workspace,
    )  # fmt: skip


def test_a_signature_is_checked_once_and_each_call_launches_at_its_own_addresses(host):
    for _ in range(3):
        args = _args(4)  # new tensors, the same signature
        torch.ops.verify_tuner.verify_attention(*args)
    assert host.checks == [(4, Q, H, 576)] and host.launches == 6
    name, values = host.last_args
    assert name == b"verify_attn_reduce" and values[3] == args[8].data_ptr()  # the last call's out
    torch.ops.verify_tuner.verify_attention(*_args(2))
    assert host.checks == [(4, Q, H, 576), (2, Q, H, 576)]


def test_threads_launching_one_kernel_never_mix_their_arguments(host, monkeypatch):
    """The launch arguments are packed into one block per kernel (kernels/runtime.PackedArgs): two
    threads calling the op with the same signature must each launch with their own addresses. The
    stand-in launch yields to the other thread before it reads the block, where a thread switch
    between a fill and its launch would show."""
    import threading
    import time

    mine, mixed, launch = threading.local(), [], host.cuLaunchKernelEx

    def yielding_launch(config, fn, params, extra):
        time.sleep(0)  # let the other thread run between this launch's fill and its read
        values = fake_driver.launch_values(fn, params)
        if fn[1] == b"verify_attn_partial" and values[0] != mine.q:
            mixed.append(values[0])
        return launch(config, fn, params, extra)

    monkeypatch.setattr(host, "cuLaunchKernelEx", yielding_launch)

    def run() -> None:
        for _ in range(200):
            args = _args(4)
            mine.q = args[0].data_ptr()
            torch.ops.verify_tuner.verify_attention(*args)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert host.launches == 800 and mixed == []


def test_a_bad_call_after_good_ones_is_still_refused(host):
    torch.ops.verify_tuner.verify_attention(*_args(4))
    with pytest.raises(ValueError, match="q must be bfloat16"):
        torch.ops.verify_tuner.verify_attention(*_args(4, q_dtype=torch.float16))
    with pytest.raises(ValueError, match="16-byte aligned"):
        torch.ops.verify_tuner.verify_attention(*_args(4, offset=4))  # 8 bytes off
    bad = list(_args(4))
    bad[3] = torch.zeros(4, dtype=torch.int32)  # kv_indptr one short
    with pytest.raises(ValueError, match=r"kv_indptr must be \[5\]"):
        torch.ops.verify_tuner.verify_attention(*bad)


def test_a_caller_s_workspace_is_checked_per_shape_and_used_at_its_address(host):
    need = op.workspace_bytes(op.config_list(CFG), H=H, q_len=Q, batch=4)
    ws = torch.zeros(need, dtype=torch.uint8)
    torch.ops.verify_tuner.verify_attention(*_args(4, workspace=ws))
    name, values = host.last_args
    assert name == b"verify_attn_reduce" and values[0] == ws.data_ptr()  # the partials in the caller's buffer
    with pytest.raises(ValueError, match=f"at least {need} bytes"):
        torch.ops.verify_tuner.verify_attention(*_args(4, workspace=ws[: need - 1]))
    assert op._workspace == {}  # the op kept none of its own


def test_the_op_keeps_one_workspace_per_batch_size_when_given_none(host):
    for B in (1, 4, 4, 1):
        torch.ops.verify_tuner.verify_attention(*_args(B))
    assert sorted(k[-1] for k in op._workspace) == [1, 4]
    (kept,) = [buf for key, buf in op._workspace.items() if key[-1] == 4]
    assert kept.numel() == abi.LaunchSpec(CFG, H, Q).workspace_bytes(4)


def test_one_shared_workspace_is_sized_for_the_largest_batch():
    cfgs = {bs: op.config_list(CFG) for bs in (1, 2, 4, 8, 16, 32, 64)}
    assert op.shared_workspace_bytes(cfgs, H=H, q_len=Q) == op.workspace_bytes(cfgs[64], H=H, q_len=Q, batch=64)


def test_the_host_cost_bench_times_every_kind_against_the_empty_op(monkeypatch):
    """bench/host_cost.py --stub's measurement, tiny: every kind runs and is reported."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    fake_driver.host_only(monkeypatch.setattr, monkeypatch.setitem)
    import host_cost

    got = host_cost.measure(host_cost.calls("cpu", CFG), rounds=2, per_round=3, sync=lambda: None)
    kinds = ["empty op", "op", "backend forward_extend", "adapter forward"]
    assert (
        list(got["us per call (median)"]) == kinds and got["ratio to the empty op (median of rounds)"]["empty op"] == 1
    )
    assert all(v > 0 for v in got["us per call (median)"].values())


def test_the_workspace_report_shares_one_buffer_sized_for_the_largest_batch(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import workspace_mb

    table = workspace_mb.rows([1, 2, 4, 8, 16, 32, 64], 9)
    assert len(table) == len(workspace_mb.DEVICES) * len(workspace_mb.HEADS)
    for r in table:
        assert 0 < r["one shared MB"] < r["one per batch size MB"]


def _e4m3_args(B: int, storage=torch.uint8) -> list:
    args = list(_args(B))
    args[2] = torch.zeros(100, 576, dtype=storage)  # SGLang's fp8 pool: one byte an element
    return args


def test_a_format_the_kernel_does_not_read_yet_is_refused_by_name(host, monkeypatch):
    import dataclasses

    from verify_tuner.kernels import formats
    from verify_tuner.kernels.errors import InvalidConfig

    listed = dataclasses.replace(formats.FORMATS["fp8_e4m3"], name="fp8_e5m2", code=9, kernel_reads=False)
    monkeypatch.setitem(formats.FORMATS, "fp8_e5m2", listed)
    with pytest.raises(InvalidConfig, match=r"kv_dtype fp8_e5m2 \(.*\) is not read by this kernel version yet"):
        torch.ops.verify_tuner.verify_attention(*_e4m3_args(4), kv_dtype="fp8_e5m2", kv_scale=0.02)
    assert host.launches == 0


def test_flashmlas_rows_reach_the_launch_and_carry_their_own_scales(host):
    """fp8_ds_mla: 656-byte rows (512 e4m3, 4 fp32 scales, 64 bf16 rope) as uint8 or torch's fp8,
    with no layer scale: one given is refused, not ignored, and a 576-wide pool is named."""
    from verify_tuner.kernels.validate import smem_bytes

    host.globals[b"kSmemBytes"] = smem_bytes(CFG, Q, "fp8_ds_mla")  # its build's layout (656-byte ring rows)
    args = _e4m3_args(4)
    for storage in (torch.uint8, torch.float8_e4m3fn):
        args[2] = torch.zeros(100, 656, dtype=storage)
        before = host.launches
        torch.ops.verify_tuner.verify_attention(*args, kv_dtype="fp8_ds_mla")
        assert host.launches > before
    launches = host.launches
    with pytest.raises(
        ValueError, match=r"fp8_ds_mla's rows carry their own scales and take no kv_scale \(got kv_scale=0.02\)"
    ):
        torch.ops.verify_tuner.verify_attention(*args, kv_dtype="fp8_ds_mla", kv_scale=0.02)
    with pytest.raises(ValueError, match=r"kv must be \[\*, 656\]"):
        torch.ops.verify_tuner.verify_attention(*_e4m3_args(4), kv_dtype="fp8_ds_mla")
    assert host.launches == launches


def test_an_e4m3_pool_reaches_the_launch_with_its_scale(host, monkeypatch):
    """The e4m3 path: the pool's dtype checked against the format, the layer's scale as a value
    and, for a captured graph, as a device float whose address the kernel reads."""
    from verify_tuner.kernels.validate import smem_bytes

    host.globals[b"kSmemBytes"] = smem_bytes(CFG, Q, "fp8_e4m3")  # the e4m3 build's layout (q's row scales)
    partial_args = []
    launch = host.cuLaunchKernelEx
    monkeypatch.setattr(
        host, "cuLaunchKernelEx", lambda c, fn, a, e: (fn[1] == b"verify_attn_partial" and partial_args.append(fake_driver.launch_values(fn, a))) or launch(c, fn, a, e)
    )  # fmt: skip
    for storage in (torch.uint8, torch.float8_e4m3fn):
        torch.ops.verify_tuner.verify_attention(*_e4m3_args(4, storage), kv_dtype="fp8_e4m3", kv_scale=0.02)
        assert tuple(partial_args[-1][-2:]) == (0, pytest.approx(0.02))  # no device scale: the value
    scale = torch.tensor(0.03, dtype=torch.float32)
    torch.ops.verify_tuner.verify_attention(*_e4m3_args(4), kv_dtype="fp8_e4m3", kv_scale_tensor=scale)
    assert partial_args[-1][-2] == scale.data_ptr()
    with pytest.raises(ValueError, match="kv must be uint8 or float8_e4m3fn for kv_dtype fp8_e4m3, got bfloat16"):
        torch.ops.verify_tuner.verify_attention(*_args(4), kv_dtype="fp8_e4m3")
    with pytest.raises(ValueError, match=r"kv_scale_tensor must be one float32 .* got bfloat16 \[\]"):
        torch.ops.verify_tuner.verify_attention(
            *_e4m3_args(4), kv_dtype="fp8_e4m3", kv_scale_tensor=torch.tensor(0.03, dtype=torch.bfloat16)
        )
    with pytest.raises(ValueError, match="unknown kv_dtype 'fp4'"):
        torch.ops.verify_tuner.verify_attention(*_e4m3_args(4), kv_dtype="fp4")


def test_a_scale_on_a_format_without_one_is_refused_not_ignored(host):
    """The bf16 kernel reads its rows as stored: a layer scale given with it would be dropped
    silently, so the op refuses it (SGLang's backend folds a bf16 pool's k_scale into the softmax
    scale and the output itself)."""
    with pytest.raises(ValueError, match=r"kv_dtype bf16 is read as stored and takes no kv_scale \(got kv_scale=0.5\)"):
        torch.ops.verify_tuner.verify_attention(*_args(4), kv_scale=0.5)
    with pytest.raises(ValueError, match=r"takes no kv_scale \(got kv_scale_tensor\)"):
        torch.ops.verify_tuner.verify_attention(*_args(4), kv_scale_tensor=torch.tensor(1.0))
    assert host.launches == 0
    torch.ops.verify_tuner.verify_attention(*_args(4), kv_scale=1.0)  # the default: nothing to drop
    assert host.launches == 2
