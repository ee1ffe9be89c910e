"""Graph plan sets and verifications in the store, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest
from verify_tuner.errors import StorageError
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.keys import ConfigKey, TableKey
from verify_tuner.store import best_configs, data_version, devices, plans
from verify_tuner.store.session import session_scope

H200 = known_device("h200")
KH = "k" * 16
CFG = KernelConfig(nsplit=64, ht=8, tk=32, block=256, stages=3)
OTHER = KernelConfig(nsplit=32, ht=8, tk=32, block=256, stages=3)
TABLE = TableKey(H200.name, KH, "bf16", 8, 9)
PLAN = plans.PlanRow(
    table=TABLE,
    batch_bucket=3,
    bucket_lo=10,
    bucket_hi=12,
    range_lo=10,
    range_hi=12,
    weights_digest="d" * 64,
    weights={"source": "equal", "outside": 0.0, "buckets": {"10": 0.5, "12": 0.5}},
    config=CFG,
    expected_us=20.0,
    per_bucket=[{"bucket": 10, "us": 10.0, "best_us": 9.0, "regret": 10 / 9}],
    batch=8,
    measured_by="NVIDIA H200 driver 570",
    rounds=3,
)


def _record(sessions) -> None:  # type: ignore[no-untyped-def]
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=H200)


def test_a_plan_round_trips_and_a_remeasurement_replaces_it(sessions):
    _record(sessions)
    with session_scope(sessions) as s:
        before = data_version.data_stamp(session=s)
        plans.upsert_plan(session=s, plan=PLAN)
    with session_scope(sessions) as s:
        after = data_version.data_stamp(session=s)
        (got,) = plans.list_plans(session=s, device=H200.name)
    assert after.version == before.version + 1 and after.plans == 1
    assert got.config == CFG and got.regret_at(10) == pytest.approx(10 / 9) and got.regret_at(11) is None
    assert got.measured_at is not None and got.weights["buckets"]["12"] == 0.5
    with session_scope(sessions) as s:
        plans.upsert_plan(session=s, plan=replace(PLAN, config=OTHER, expected_us=19.0))
        (got,) = plans.list_plans(session=s)
    assert got.config == OTHER and got.expected_us == 19.0


def test_the_newest_plan_of_a_batch_bucket_is_served(sessions):
    _record(sessions)
    old = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    with session_scope(sessions) as s:
        plans.upsert_plan(session=s, plan=replace(PLAN, measured_at=old))
        plans.upsert_plan(session=s, plan=replace(PLAN, weights_digest="e" * 64, config=OTHER))
        plans.upsert_plan(session=s, plan=replace(PLAN, batch_bucket=0, measured_at=old))
    with session_scope(sessions) as s:
        served = plans.served_sets(session=s, table=TABLE)
        assert plans.served_sets(session=s, table=replace(TABLE, kernel_hash="x")) == {}
    assert [p.config for p in served[3].ranges] == [OTHER] and [p.config for p in served[0].ranges] == [CFG]
    assert set(served) == {0, 3} and served[3].breakpoints == ()


def test_a_plan_needs_a_recorded_device(sessions):
    with pytest.raises(StorageError, match="not recorded"), session_scope(sessions) as s:
        plans.upsert_plan(session=s, plan=PLAN)


def test_plans_go_with_the_bests_they_were_built_from(sessions):
    """DELETE /configs removed the bests and kept serving the plan chosen from them."""
    _record(sessions)
    with session_scope(sessions) as s:
        plans.upsert_plan(session=s, plan=PLAN)  # buckets 10..12, batch bucket 3
        plans.upsert_plan(session=s, plan=replace(PLAN, batch_bucket=0))
        wide = replace(PLAN, table=replace(TABLE, H=16), bucket_lo=0, bucket_hi=4)
        plans.store_plan_set(session=s, plans=_split(wide, 2))  # two ranges: both go with any best
    with session_scope(sessions) as s:
        assert plans.delete_plans(session=s, device=H200.name, bucket=9) == 0  # no range holds it
        assert plans.delete_plans(session=s, device="nope") == 0
        assert plans.delete_plans(session=s, device=H200.name, H=8, bucket=11, batch_bucket=3) == 1
        assert plans.delete_plans(session=s, device=H200.name, H=16, bucket=0) == 2  # the whole set
    with session_scope(sessions) as s:
        assert {(p.table.H, p.batch_bucket) for p in plans.list_plans(session=s)} == {(8, 0)}
        assert plans.delete_plans(session=s, device=H200.name, q_len=9) == 1
        assert plans.list_plans(session=s) == []


def _split(whole: plans.PlanRow, at: int, config: KernelConfig = OTHER) -> list[plans.PlanRow]:
    """`whole`'s measured range as two ranges, the second from prefix bucket `at` with `config`."""
    return [
        replace(whole, range_lo=whole.bucket_lo, range_hi=at - 1, max_graphs=2, by_count=[20.0, 18.0]),
        replace(whole, range_lo=at, range_hi=whole.bucket_hi, config=config, max_graphs=2, by_count=[20.0, 18.0]),
    ]


def test_a_set_is_stored_served_and_replaced_whole(sessions):
    """A re-measurement with other breakpoints replaces every range of the set it supersedes: no
    range of the old set is served beside the new one's."""
    _record(sessions)
    wide = replace(PLAN, bucket_lo=5, bucket_hi=18, range_lo=5, range_hi=18)
    with session_scope(sessions) as s:
        plans.store_plan_set(session=s, plans=_split(wide, 9))
    with session_scope(sessions) as s:
        (served,) = plans.served_sets(session=s, table=TABLE).values()
    assert [(p.range_lo, p.range_hi, p.config) for p in served.ranges] == [(5, 8, CFG), (9, 18, OTHER)]
    assert served.breakpoints == (4096,) and [served.index_of(p) for p in (0, 4095, 4096, 10**6)] == [0, 0, 1, 1]
    assert served.ranges[0].measured_at == served.ranges[1].measured_at and served.ranges[1].by_count == [20.0, 18.0]
    three = _split(wide, 12)
    three = [*_split(replace(three[0], bucket_hi=11), 7), replace(three[1], max_graphs=3)]
    with session_scope(sessions) as s:
        plans.store_plan_set(session=s, plans=[replace(p, bucket_hi=18, max_graphs=3) for p in three])
    with session_scope(sessions) as s:
        (served,) = plans.served_sets(session=s, table=TABLE).values()
        assert len(plans.list_plans(session=s)) == 3
    assert [(p.range_lo, p.range_hi) for p in served.ranges] == [(5, 6), (7, 11), (12, 18)]
    assert served.breakpoints == (2048, 11585)


def test_a_newer_set_of_other_weights_is_served_whole_and_the_older_kept(sessions):
    _record(sessions)
    old = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    with session_scope(sessions) as s:
        plans.store_plan_set(session=s, plans=_split(replace(PLAN, measured_at=old), 11))
        plans.store_plan_set(session=s, plans=[replace(PLAN, weights_digest="e" * 64)])
    with session_scope(sessions) as s:
        (served,) = plans.served_sets(session=s, table=TABLE).values()
        assert len(plans.list_plans(session=s)) == 3
    assert [p.weights_digest for p in served.ranges] == ["e" * 64]


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: [r[0]],  # a gap at the end
        lambda r: [r[1]],  # a gap at the start
        lambda r: [r[0], replace(r[1], range_lo=12)],  # a gap between
        lambda r: [r[0], replace(r[1], weights_digest="e" * 64)],  # two sets
        lambda r: [],
    ],
)
def test_ranges_that_are_not_one_tiling_set_are_refused(sessions, edit):
    _record(sessions)
    with pytest.raises(ValueError), session_scope(sessions) as s:
        plans.store_plan_set(session=s, plans=edit(_split(PLAN, 11)))
    with session_scope(sessions) as s:
        assert plans.list_plans(session=s) == []


def _verification(key: ConfigKey, cfg: KernelConfig, verdict: str) -> plans.VerificationRow:
    return plans.VerificationRow(
        key=key,
        config=cfg,
        stored_us=20.0,
        measured_us=30.0,
        measured_p10_us=29.0,
        measured_p90_us=31.0,
        heuristic=OTHER,
        heuristic_us=25.0,
        heuristic_p10_us=24.0,
        heuristic_p90_us=26.0,
        noise=0.05,
        verdict=verdict,
        reason="the heuristic is faster",
        measured_by="test",
    )


def test_a_verdict_marks_the_row_keeps_history_and_a_retune_clears_it(sessions):
    _record(sessions)
    key = ConfigKey(H200.name, KH, "bf16", 8, 9, 15, 3)
    with session_scope(sessions) as s:
        best_configs.upsert_best(session=s, row=best_configs.BestRow(key, CFG, median_us=20.0))
    with session_scope(sessions) as s:
        assert plans.record_verification(session=s, v=_verification(key, CFG, "stale"))
        assert not plans.record_verification(session=s, v=_verification(key, OTHER, "stale"))  # not the row's config
        assert not plans.record_verification(session=s, v=_verification(replace(key, bucket=16), CFG, "stale"))
    with session_scope(sessions) as s:
        row = best_configs.get_best(session=s, key=key)
        assert row.stale and row.verified_at is not None and data_version.data_stamp(session=s).stale == 1
        assert [v.verdict for v in plans.list_verifications(session=s)] == ["stale"] * 3
    with session_scope(sessions) as s:  # a re-tune stores the row again
        best_configs.upsert_best(session=s, row=best_configs.BestRow(key, OTHER, median_us=18.0))
    with session_scope(sessions) as s:
        row = best_configs.get_best(session=s, key=key)
        assert row.verdict is None and not row.stale and data_version.data_stamp(session=s).stale == 0
        assert len(plans.list_verifications(session=s, device=H200.name)) == 3  # nothing deleted
