"""The graph plan's selection (pure): expected step time under the prefix weights, regret per
bucket against the bucket's own best, failures, and deterministic tie-breaks."""

from __future__ import annotations

import itertools
import math

import pytest
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.search import graph_plan
from verify_tuner.search.prefix_weights import PrefixWeights

A = KernelConfig(nsplit=64, ht=8, tk=32, block=256)
B = KernelConfig(nsplit=32, ht=8, tk=32, block=256)
C = KernelConfig(nsplit=128, ht=8, tk=32, block=256)
BUCKETS = [10, 11, 12]


def _equal(idx=BUCKETS) -> PrefixWeights:  # type: ignore[no-untyped-def]
    return PrefixWeights({b: 1 / len(idx) for b in idx})


def test_the_config_of_least_expected_time_wins_and_regret_is_against_each_buckets_best():
    # A is best at short prefixes, B at long ones, C is never best but never bad
    times = [[10.0, 20.0, 60.0], [14.0, 21.0, 40.0], [11.0, 20.5, 42.0]]
    plan = graph_plan.choose(configs=[A, B, C], bucket_indices=BUCKETS, times=times, weights=_equal())
    assert plan.config == C and plan.expected_us == pytest.approx((11 + 20.5 + 42) / 3)
    assert [b.regret for b in plan.buckets] == pytest.approx([1.1, 1.025, 1.05])
    assert [b.best for b in plan.buckets] == [A, A, B]
    assert plan.worst_regret == pytest.approx(1.1)
    assert plan.geomean_regret == pytest.approx(math.exp((math.log(1.1) + math.log(1.025) + math.log(1.05)) / 3))
    assert [c for c, _ in plan.ranking] == [C, B, A]


def test_weights_move_the_choice():
    times = [[10.0, 20.0, 60.0], [14.0, 21.0, 40.0]]
    short = graph_plan.weighted_by({10: 8, 11: 1, 12: 1})
    long_ = graph_plan.weighted_by({10: 1, 11: 1, 12: 8})
    assert graph_plan.choose(configs=[A, B], bucket_indices=BUCKETS, times=times, weights=short).config == A
    assert graph_plan.choose(configs=[A, B], bucket_indices=BUCKETS, times=times, weights=long_).config == B


def test_a_finalist_that_failed_somewhere_is_not_eligible_but_still_a_buckets_best():
    times = [[5.0, None, 30.0], [10.0, 20.0, 40.0]]
    plan = graph_plan.choose(configs=[A, B], bucket_indices=BUCKETS, times=times, weights=_equal())
    assert plan.config == B and plan.ineligible == ((A, (11,)),)
    assert plan.buckets[0].best == A and plan.buckets[0].regret == pytest.approx(2.0)
    with pytest.raises(ValueError, match="every finalist failed"):
        graph_plan.choose(
            configs=[A, B], bucket_indices=BUCKETS, times=[[5.0, float("inf"), 1.0], [1.0, 1.0, None]], weights=_equal()
        )


def test_ties_break_the_same_way_in_any_input_order():
    times = {A: [10.0, 20.0, 30.0], B: [10.0, 20.0, 30.0], C: [12.0, 19.0, 29.0]}  # all expect 20 us
    answers = set()
    for order in itertools.permutations([A, B, C]):
        for cols in itertools.permutations(range(3)):
            plan = graph_plan.choose(
                configs=list(order),
                bucket_indices=[BUCKETS[j] for j in cols],
                times=[[times[c][j] for j in cols] for c in order],
                weights=_equal(),
            )
            answers.add((plan.config, tuple((b.bucket, b.best) for b in plan.buckets)))
    # C has the same expected time but a worse worst regret; A and B tie fully: the constants decide
    assert len(answers) == 1
    ((cfg, per_bucket),) = answers
    assert cfg == min(A, B, key=graph_plan.order_key)
    assert [b for b, _ in per_bucket] == BUCKETS


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"times": [[1.0, 2.0]]}, "1 x 3"),
        ({"configs": [A, A], "times": [[1.0] * 3] * 2}, "distinct"),
        ({"weights": PrefixWeights({10: 1.0})}, "weights cover"),
        ({"times": [[None, 1.0, 1.0]]}, "no finalist ran at prefix bucket 10"),
    ],
)
def test_inputs_that_disagree_are_refused(kw, match):
    args = {"configs": [A], "bucket_indices": BUCKETS, "times": [[1.0, 2.0, 3.0]], "weights": _equal()} | kw
    with pytest.raises(ValueError, match=match):
        graph_plan.choose(**args)
