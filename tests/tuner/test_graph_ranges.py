"""Graphs per prefix range (pure): the breakpoints that minimise the expected step time, a further
graph only where it saves its share, failures per range, and the same answer in any input order."""

from __future__ import annotations

import itertools

import pytest
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.search import graph_plan
from verify_tuner.search.graph_ranges import choose_ranges
from verify_tuner.search.prefix_weights import PrefixWeights

SHORT = KernelConfig(nsplit=24, ht=8, tk=32, block=256, qt=2)  # small blocks: fast at short prefixes
LONG = KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3)  # the default
MID = KernelConfig(nsplit=66, ht=4, tk=32, block=256)
BUCKETS = [0, 4, 8, 12, 16, 20]
#: B=1 at H=8 q=9 in shape: SHORT wins below ~4k and loses 1.5-3.9x at long prefixes (µs)
TIMES = {
    SHORT: [6.6, 9.0, 12.4, 30.0, 95.0, 340.0],
    LONG: [11.9, 14.0, 17.9, 25.0, 42.0, 86.7],
    MID: [9.0, 11.0, 15.0, 26.0, 50.0, 120.0],
}


def _equal(idx=BUCKETS) -> PrefixWeights:  # type: ignore[no-untyped-def]
    return PrefixWeights({b: 1 / len(idx) for b in idx})


def _plan(configs=(SHORT, LONG, MID), times=TIMES, weights=None, **kw):  # type: ignore[no-untyped-def]
    return choose_ranges(
        configs=list(configs),
        bucket_indices=BUCKETS,
        times=[times[c] for c in configs],
        weights=weights or _equal(),
        **kw,
    )


def test_two_graphs_split_where_the_short_config_stops_winning():
    plan = _plan()
    assert [p.config for p in plan.ranges] == [SHORT, LONG] and plan.breakpoints == (12,)
    assert plan.expected_us == pytest.approx((6.6 + 9.0 + 12.4 + 25.0 + 42.0 + 86.7) / 6)
    assert plan.worst_regret == pytest.approx(1.0) and plan.geomean_regret == pytest.approx(1.0)
    one = graph_plan.choose(configs=[SHORT, LONG, MID], bucket_indices=BUCKETS,
                            times=[TIMES[c] for c in (SHORT, LONG, MID)], weights=_equal())  # fmt: skip
    assert plan.by_count[0] == pytest.approx(one.expected_us) and plan.by_count[1] == pytest.approx(plan.expected_us)
    # each range's plan reports its buckets' regret against the bucket's own best
    assert [b.bucket for b in plan.ranges[0].buckets] == [0, 4, 8] and plan.ranges[1].buckets[0].best == LONG


def test_one_graph_is_the_single_config_choice():
    plan = _plan(max_graphs=1)
    one = graph_plan.choose(configs=[SHORT, LONG, MID], bucket_indices=BUCKETS,
                            times=[TIMES[c] for c in (SHORT, LONG, MID)], weights=_equal())  # fmt: skip
    assert len(plan.ranges) == 1 and plan.ranges[0].config == one.config == LONG
    assert plan.expected_us == pytest.approx(one.expected_us)


def test_a_further_graph_must_save_its_share():
    # long prefixes dominate the distribution: splitting off the short buckets saves ~1 %
    heavy_long = graph_plan.weighted_by({0: 1, 4: 1, 8: 1, 12: 20, 16: 40, 20: 40})
    assert len(_plan(weights=heavy_long).ranges) == 1
    assert len(_plan(weights=heavy_long, min_saving=0.001).ranges) == 2
    assert len(_plan(max_graphs=3, min_saving=0.0).ranges) <= 3  # never more than asked


def test_three_graphs_when_each_split_pays():
    times = {SHORT: [5.0, 6.0, 30.0, 60.0, 90.0, 120.0], MID: [20.0, 21.0, 10.0, 11.0, 90.0, 120.0],
             LONG: [30.0, 31.0, 32.0, 33.0, 40.0, 41.0]}  # fmt: skip
    plan = _plan(times=times, max_graphs=3)
    assert [p.config for p in plan.ranges] == [SHORT, MID, LONG] and plan.breakpoints == (8, 16)
    assert len(plan.by_count) == 3 and plan.by_count[0] > plan.by_count[1] > plan.by_count[2]


def test_a_config_that_failed_at_long_prefixes_can_serve_the_short_range():
    times = {**TIMES, SHORT: [6.6, 9.0, 12.4, None, float("inf"), None]}
    plan = _plan(times=times)
    assert [p.config for p in plan.ranges] == [SHORT, LONG]
    assert plan.ranges[1].ineligible == ((SHORT, (12, 16, 20)),)
    with pytest.raises(ValueError, match="no finalist ran at prefix bucket 12"):
        _plan(configs=(SHORT,), times=times)


def test_two_configs_that_each_fail_somewhere_cover_the_range_between_them():
    times = {SHORT: [6.6, 9.0, 12.4, None, None, None], LONG: [None, 14.0, 17.9, 25.0, 42.0, 86.7]}
    plan = _plan(configs=(SHORT, LONG), times=times)
    assert [p.config for p in plan.ranges] == [SHORT, LONG] and plan.breakpoints == (12,)
    assert plan.by_count[0] == float("inf")  # no single graph could serve every bucket
    with pytest.raises(ValueError, match="no split into at most 1 graphs"):
        _plan(configs=(SHORT, LONG), times=times, max_graphs=1)


def test_a_range_the_distribution_never_reaches_adds_no_graph():
    weights = graph_plan.weighted_by({0: 0, 4: 0, 8: 0, 12: 1, 16: 1, 20: 1})
    plan = _plan(weights=weights)
    assert len(plan.ranges) == 1 and plan.ranges[0].config == LONG


def test_the_same_plan_in_any_input_order():
    answers = set()
    for order in itertools.permutations([SHORT, LONG, MID]):
        for perm in itertools.permutations(range(len(BUCKETS)), 2):
            cols = list(range(len(BUCKETS)))
            cols[perm[0]], cols[perm[1]] = cols[perm[1]], cols[perm[0]]
            plan = choose_ranges(
                configs=list(order),
                bucket_indices=[BUCKETS[j] for j in cols],
                times=[[TIMES[c][j] for j in cols] for c in order],
                weights=_equal(),
            )
            answers.add((tuple(p.config for p in plan.ranges), plan.breakpoints))
    assert answers == {((SHORT, LONG), (12,))}


@pytest.mark.parametrize("kw, match", [({"max_graphs": 0}, "max_graphs"), ({"min_saving": 1.0}, "min_saving")])
def test_bad_arguments_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        _plan(**kw)
