"""bench/engine_loop.py's engine side on the CPU (the loop itself needs the GPU): its schedules
reach what the loop promises (requests joining at P=0, prefixes across at least 3 buckets), and
a few dozen steps through the backend's own hooks -- metadata in SGLang's order, FULL_MASK EAGLE
trees written where the draft stage writes them, the draft KV written per layer -- check out
against attention on SGLang's tensors, with the op as its fp32 reference."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.engine.tree_masks import TreeMaskMode

from tests.engine.fake_driver import CFG
from tests.engine.sglang_doubles import ReferenceOp


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import engine_loop
    import engine_steps

    return engine_loop, engine_steps


def test_each_batch_s_schedule_joins_requests_and_crosses_three_buckets(bench):
    engine_loop, engine_steps = bench
    for bs, (starts, stops) in engine_loop.BATCHES.items():
        sched = engine_steps.Schedule(starts, stops, seed=bs)
        rows_seen = set(sched.rows)
        for _ in range(engine_loop.STEPS):
            before = list(sched.lens)
            sched.advance()
            rows_seen |= set(sched.rows)
            assert all(n == 0 or 1 <= n - b <= sched.accept_max for n, b in zip(sched.lens, before))
            assert len(set(sched.rows)) == bs  # a row holds one request
        assert sched.joined >= 1 and len(rows_seen) > bs, bs  # new requests in other rows
        assert len(sched.buckets) >= 3, (bs, sched.buckets)
        assert max(sched.lens) + sched.accept_max + engine_steps.Q <= sched.width


@pytest.mark.parametrize("mode", [TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY])
def test_the_loop_s_steps_check_out_through_the_backend(bench, mode):
    _, steps = bench
    sched = steps.Schedule([300, 0, 240], [330, 40, 400], spare=2, seed=3)
    eng = steps.LoopEngine(sched, layers=2, device="cpu", pick_config=lambda q, bs: CFG, mode=mode)
    eng.backend.op = ReferenceOp()
    eng.prepare()
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


def test_an_fp8_pool_is_a_row_that_says_why_it_did_not_run(bench):
    _, steps = bench
    sched = steps.Schedule([10], [50])
    with pytest.raises(NotImplementedError, match="float8_e4m3fn"):
        steps.LoopEngine(sched, layers=1, device="cpu", pick_config=lambda q, bs: CFG, mode=TreeMaskMode.FULL_MASK,
                         pool_dtype=torch.float8_e4m3fn)  # fmt: skip
