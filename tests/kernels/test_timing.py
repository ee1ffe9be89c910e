"""The timing helpers that need no GPU: interleaved rounds (the A/B order every benchmark and the
tuner's re-timing rely on) and the summary statistics."""

from __future__ import annotations

from verify_tuner.kernels.timing import interleave, summarize


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
