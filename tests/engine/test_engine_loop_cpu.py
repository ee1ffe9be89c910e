"""bench/engine_loop.py's engine side on the CPU (the loop itself needs the GPU): its schedules
reach what the loop promises (the batch's longest prefix crossing the first breakpoint, then
prefixes over 0..131k, requests joining at P=0 and at long prompts), and a few dozen steps through
the backend's own hooks -- metadata in SGLang's order, a graph per prefix range captured with its
attention variant and the one `select` gives replayed, FULL_MASK EAGLE trees written where the
draft stage writes them, the draft KV written per layer -- check out against attention on
SGLang's tensors, with the op as its fp32 reference."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.engine import op
from verify_tuner.engine.tree_masks import TreeMaskMode
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.limits import known_device
from verify_tuner.kernels.validate import check

from tests.engine.fake_driver import CFG
from tests.engine.sglang_doubles import ReferenceOp


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import engine_loop
    import engine_steps

    return engine_loop, engine_steps


def _longest(sched, steps: int) -> list[int]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(steps):
        out.append(max(sched.lens))
        before = list(sched.lens)
        sched.advance()
        assert all(n in sched.joins or 1 <= n - b <= sched.accept_max for n, b in zip(sched.lens, before))
        assert len(set(sched.rows)) == len(before)  # a row holds one request
    return out


@pytest.mark.parametrize("bs", [1, 8, 32])
@pytest.mark.parametrize("breakpoint", [1448, 4096, 11585])
def test_each_batch_s_schedules_cross_the_breakpoint_then_span_0_to_131k(bench, bs, breakpoint):
    engine_loop, engine_steps = bench
    crossing, spread = engine_loop.schedules(bs, breakpoint)
    first = _longest(crossing, engine_loop.CROSSING)
    assert min(first) < breakpoint <= max(first)  # the batch replays both ranges' graphs
    assert crossing.joined >= 1 and crossing.width <= spread.width and len(crossing.rows) == len(spread.rows)
    rest = _longest(spread, engine_loop.STEPS - engine_loop.CROSSING)
    seen = {n for n in spread.lens} | set(rest)
    assert max(rest) <= engine_loop.MAX_PREFIX and max(rest) >= 100_000 and spread.joined >= 1
    assert max(max(spread.lens), max(rest)) + spread.accept_max + engine_steps.Q <= spread.width
    assert bs == 1 or min(seen) < 1024  # short requests beside long ones


def test_without_a_plan_the_loop_s_two_ranges_run_on_the_devices(bench):
    for device in ("h200", "rtx-pro-6000"):
        assert check(bench[0].SHORT, known_device(device), H=8, q_len=9) is None


@pytest.mark.parametrize("mode", [TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY])
def test_the_loop_s_steps_check_out_through_the_backend(bench, mode):
    _, steps = bench
    sched = steps.Schedule([300, 0, 240], [330, 40, 400], spare=2, seed=3)
    eng = steps.LoopEngine(sched, layers=2, device="cpu", pick_config=lambda q, bs: CFG, mode=mode)
    eng.backend.op = ReferenceOp()
    eng.prepare()
    assert eng.labels == (None,)
    eng.out_graph(in_capture=True)  # what the capture runs (its forward is the warm-up's)
    eng.forward()
    for step in range(12):
        eng.prepare()
        eng.out_graph()
        outs = eng.forward()  # the replay: the in-graph refill and every layer
        rel, worst = eng.error(outs, step % 2)
        assert rel < 1e-2 and worst < 0.05, (step, rel, worst)
        sched.advance()
    assert sched.joined >= 1
    assert {c["workspace"].data_ptr() for c in eng.backend.op.calls} == {eng.backend._graph_ws.data_ptr()}


def test_the_loop_replays_the_graph_of_the_range_its_longest_prefix_is_in(bench):
    """Graphs per range as the loop captures and replays them: each label captured with its config,
    each step's label from `select`, the step's config the label's, crossing the breakpoint both ways."""
    engine_loop, steps = bench
    short = engine_loop.SHORT
    long = heuristic_config(known_device("h200"), H=8, q_len=9, prefix=4096)
    sched = steps.Schedule([280, 10, 200], [310, 40, 330], spare=2, seed=4)
    eng = steps.LoopEngine(sched, layers=2, device="cpu", mode=TreeMaskMode.FULL_MASK,
                           pick_ranges=lambda q, bs: ((0, short), (300, long)))  # fmt: skip
    eng.backend.op = ReferenceOp()
    assert eng.labels == ("prefix_range_0", "prefix_range_1")
    eng.prepare()
    graphs = {}
    for label in eng.labels:
        eng.label = label
        eng.out_graph(in_capture=True)
        eng.label = None
        eng.forward()
        graphs[label] = eng.backend.op.calls[-1]["config"]  # what the graph records
    assert graphs == {"prefix_range_0": op.config_list(short), "prefix_range_1": op.config_list(long)}
    seen = []
    for step in range(40):
        eng.prepare()
        label = eng.select()
        eng.out_graph()
        outs = eng.forward()
        assert eng.backend.op.calls[-1]["config"] == graphs[label]
        assert eng.error(outs, step % 2)[0] < 1e-2
        seen.append((max(sched.lens) >= 300, label))
        sched.advance()
    assert {label for _, label in seen} == set(graphs) and all((lab == "prefix_range_1") == up for up, lab in seen)
    assert eng.backend.graphs.length_syncs == 0  # the range read from the host lengths


def test_an_fp8_pool_runs_through_the_backend_as_the_e4m3_format(bench):
    _, steps = bench
    sched = steps.Schedule([10], [50])
    eng = steps.LoopEngine(sched, layers=1, device="cpu", pick_config=lambda q, bs: CFG, mode=TreeMaskMode.FULL_MASK,
                           pool_dtype=torch.float8_e4m3fn)  # fmt: skip
    assert eng.backend.kv_dtype == "fp8_e4m3" and eng.pool.get_key_buffer(0).dtype == torch.float8_e4m3fn


def test_the_qk_mode_runs_through_the_backend_checked_against_q_as_it_quantizes_it(bench):
    """fp8_e4m3_qk on SGLang's e4m3 pool: the backend computes with q quantized per row, so the
    loop's reference on SGLang's tensors quantizes q the same way; against the unquantized q the
    same output is off by e4m3's rounding, which a gate as strict as bf16's would flag."""
    _, steps = bench
    sched = steps.Schedule([300, 0, 240], [330, 40, 400], spare=2, seed=5)
    eng = steps.LoopEngine(sched, layers=1, device="cpu", pick_config=lambda q, bs: CFG, mode=TreeMaskMode.FULL_MASK,
                           pool_dtype=torch.float8_e4m3fn, kv_dtype="fp8_e4m3_qk")  # fmt: skip
    eng.backend.op = ReferenceOp()
    assert eng.backend.kv_dtype == "fp8_e4m3_qk"
    eng.prepare()
    eng.out_graph()
    outs = eng.forward()
    assert eng.backend.op.calls[-1]["kv_dtype"] == "fp8_e4m3_qk"
    rel, _ = eng.error(outs, 0)
    assert rel < 5e-3, rel  # the same computation on the same quantized q, up to the bf16 output
    eng.backend.kv_dtype = "fp8_e4m3"  # what the reference would take q as without the mode
    assert eng.error(outs, 0)[0] > 1e-2


def test_the_loop_runs_every_format_the_kernel_reads_and_refuses_others_by_name(bench):
    import argparse

    from verify_tuner.kernels.formats import KV_DTYPES

    engine_loop, _ = bench
    assert engine_loop.MLA_POOL_FORMATS == ["bf16", "fp8_e4m3", "fp8_e4m3_qk"]
    assert engine_loop.kv_dtypes_arg(",".join(engine_loop.MLA_POOL_FORMATS)) == engine_loop.MLA_POOL_FORMATS
    assert set(KV_DTYPES) - set(engine_loop.MLA_POOL_FORMATS) == {"fp8_ds_mla"}
    for bad, words in (
        ("fp8_ds_mla", "reads 656-byte rows .*SGLang's MLA pool holds 576 elements a row"),
        ("fp16", "unknown kv_dtype 'fp16'"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            engine_loop.kv_dtypes_arg(bad)


def test_the_loop_plans_each_cache_format_at_its_own_default(bench):
    """An engine holding an e4m3 cache is served e4m3's default (the service keys tables by kv_dtype):
    the loop's long range runs that config, not bf16's on the e4m3 cache."""
    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.kernels.limits import known_device

    engine_loop, _ = bench
    h200 = known_device("h200")
    picked = {}
    for kv in ("bf16", "fp8_e4m3"):
        ranges = engine_loop.range_picker(h200, None, 4096, kv)(9, 1)
        assert ranges[0] == (0, engine_loop.SHORT)
        assert ranges[1] == (4096, heuristic_config(h200, H=8, q_len=9, prefix=4096, batch=1, kv_dtype=kv))
        picked[kv] = ranges[1][1]
    assert picked["fp8_e4m3"] != picked["bf16"]


def test_a_row_says_whether_its_worst_step_stays_within_the_gate(bench):
    """The loop checks every step: a row carries its verdict and how many steps went over, so a
    format whose worst step misses the kernel tests' gate is not reported as checked and fine."""
    engine_loop, _ = bench
    eng = types.SimpleNamespace(
        backend=types.SimpleNamespace(kv_dtype="fp8_e4m3_qk", workspace_bytes=lambda: 2**20,
                                      graphs=types.SimpleNamespace(length_syncs=0)),
        labels=(None,), sched=types.SimpleNamespace(joined=1),
    )  # fmt: skip
    timed = [{"kept / fresh": 1.0}]
    pick = lambda q, bs: ((0, CFG),)
    errors = [(2e-3, 0.01), (2.2e-2, 0.2), (1.1e-2, 0.1)]
    row = engine_loop._row(1, eng, pick, torch.bfloat16, 2, 0.3, errors, timed, [(None, 5), (None, 0), (None, 9)])
    assert row["rel err max <= 0.01"] is False and row["steps over the gate"] == 2
    assert row["worst steps"][:2] == [{"step": 1, "rel err": 2.2e-2, "prefix max": 0},
                                      {"step": 2, "rel err": 1.1e-2, "prefix max": 9}]  # fmt: skip
    row = engine_loop._row(1, eng, pick, torch.bfloat16, 2, 0.3, errors[:1], timed, [(None, 5)])
    assert row["rel err max <= 0.01"] is True and row["steps over the gate"] == 0
