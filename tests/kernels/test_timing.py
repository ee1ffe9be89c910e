"""The timing helpers that need no GPU: interleaved rounds (the A/B order every benchmark and the
tuner's re-timing rely on) and the summary statistics."""

from __future__ import annotations

from verify_tuner.kernels.timing import graph_shape, interleave, summarize


def test_interleave_alternates_candidates_round_by_round():
    calls: list[str] = []

    def measure(name: str, value: float):
        def run() -> float:
            calls.append(name)
            return value + len(calls)

        return run

    got = interleave([measure("A", 0.0), measure("B", 100.0)], rounds=3)
    assert calls == ["A", "B", "A", "B", "A", "B"]  # drift hits both alike
    assert got == [[1.0, 3.0, 5.0], [102.0, 104.0, 106.0]]


def test_interleave_with_no_rounds_measures_nothing():
    calls: list[int] = []
    assert interleave([lambda: calls.append(1)], rounds=0) == [[]]
    assert calls == []


def test_summarize_median_and_tails():
    t = summarize([float(x) for x in range(1, 12)])
    assert t.median_us == 6.0
    assert t.p10_us == 2.0 and t.p90_us == 10.0


def test_graph_shape_without_a_budget_is_the_fixed_shape():
    assert graph_shape(50_000.0, 2, replays=30, min_launches=24, budget_us=None) == (24, 30)


def test_graph_shape_keeps_short_kernels_as_they_were():
    # a 12 us kernel: 24 launches hide the replay's own cost; 30 replays fit the budget
    assert graph_shape(12.0, 2, replays=30, min_launches=24, budget_us=100_000.0) == (24, 30)


def test_graph_shape_shrinks_long_kernels_to_the_budget():
    launches, replays = graph_shape(700.0, 2, replays=30, min_launches=24, budget_us=100_000.0)
    assert (launches, replays) == (2, 30)  # every set still in the graph, 30 samples
    # a config 100x slower than the best: 5 replays of 2 launches, not 30 of 24 (36 s)
    launches, replays = graph_shape(50_000.0, 2, replays=30, min_launches=24, budget_us=100_000.0)
    assert (launches, replays) == (2, 5)
    assert launches * replays * 50_000.0 <= 10 * 100_000.0


def test_graph_shape_never_drops_an_input_set():
    for est in (1.0, 80.0, 400.0, 5_000.0):
        launches, _ = graph_shape(est, 7, replays=30, min_launches=24, budget_us=100_000.0)
        assert launches >= 7
