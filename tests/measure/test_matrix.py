"""verify_tuner.measure.matrix through the fake backend: every (config, workload) pair gated,
the survivors timed together at each workload, failures kept with their reason."""

from __future__ import annotations

from dataclasses import replace

from verify_tuner.heuristic import heuristic_config
from verify_tuner.measure.backend import WRONG, Workload
from verify_tuner.measure.matrix import measure_matrix

from tests.fakes import H200, FakeBackend, fake_cost

GOOD = heuristic_config(H200, H=8, q_len=9, prefix=46000)
OTHER = replace(GOOD, nsplit=64)
BAD = replace(GOOD, nsplit=12)  # the fake's wrong result
WLS = [Workload(8, 9, p, batch=8) for p in (2048, 46000, 131072)]


def test_every_pair_is_gated_then_timed_side_by_side_at_each_workload():
    be = FakeBackend(noise=0.0, wrong_nsplit=12)
    mx = measure_matrix(be, [GOOD, OTHER, BAD], WLS, rounds=2, passes=2)
    assert len(be.measured) == 9  # each pair through the gate once
    # one re-timing call per workload per pass, holding exactly the configs that passed there
    assert len(be.remeasured) == 2 * len(WLS) and all(set(c) == {GOOD, OTHER} for c in be.remeasured)
    assert be.remeasured[0] != be.remeasured[1]  # the order is rotated between calls
    med = mx.medians()
    assert med[2] == [None, None, None] and mx.cell(BAD, WLS[0]).state == WRONG
    assert mx.cell(BAD, WLS[0]).reason
    for j, wl in enumerate(WLS):
        assert med[0][j] == fake_cost(GOOD, wl) and med[1][j] == fake_cost(OTHER, wl)
        assert len(mx.cell(GOOD, wl).samples) == 2 * 2 * 10  # passes x rounds x the fake's 10 a round


def test_an_invalid_config_is_not_sent_to_the_backend():
    invalid = replace(GOOD, ht=16)  # HT beyond H=8
    be = FakeBackend()
    mx = measure_matrix(be, [GOOD, invalid], WLS[:1])
    assert mx.cell(invalid, WLS[0]).state == "invalid" and invalid not in be.measured
    assert mx.cell(GOOD, WLS[0]).ok and mx.cell(GOOD, WLS[0]).spread > 0
