from __future__ import annotations

import pytest
from verify_tuner import buckets
from verify_tuner.errors import StorageError
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.keys import ConfigKey
from verify_tuner.store import best_configs, devices, models, studies
from verify_tuner.store.session import session_scope

H200 = known_device("h200")
KEY = ConfigKey(H200.name, "k" * 16, "bf16", 8, 9, 15)
CFG = KernelConfig(nsplit=64, ht=8, tk=32, block=256, stages=3)


def _record(sessions):
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=H200)


def test_device_roundtrip_and_update(sessions):
    _record(sessions)
    with session_scope(sessions) as s:
        d = devices.get_device(session=s, name=H200.name)
        assert devices.device_limits(d) == H200
    from dataclasses import replace

    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=replace(H200, sm_count=131, copy_bw_gbps=4100.0))
    with session_scope(sessions) as s:
        assert [d.sm_count for d in devices.list_devices(session=s)] == [131]
        assert devices.get_device(session=s, name=H200.name).copy_bw_gbps == 4100.0


def test_best_upsert_replaces_and_keeps_extra_constants(sessions):
    _record(sessions)
    with session_scope(sessions) as s:
        best_configs.upsert_best(session=s, row=best_configs.BestRow(KEY, CFG, median_us=30.0, default_us=60.0))
    with session_scope(sessions) as s:
        row = best_configs.get_best(session=s, key=KEY)
    assert row.config == CFG and row.speedup == pytest.approx(2.0)
    with session_scope(sessions) as s:
        best_configs.upsert_best(session=s, row=best_configs.BestRow(KEY, KernelConfig(32, 4, 64, 512), median_us=25.0))
    with session_scope(sessions) as s:
        rows = best_configs.list_best(session=s)
    assert len(rows) == 1 and rows[0].config == KernelConfig(32, 4, 64, 512) and rows[0].median_us == 25.0


def test_best_needs_a_recorded_device(sessions):
    with pytest.raises(StorageError, match="not recorded"), session_scope(sessions) as s:
        best_configs.upsert_best(session=s, row=best_configs.BestRow(KEY, CFG, median_us=1.0))


def test_nearest_bucket_by_log_distance(sessions):
    _record(sessions)
    with session_scope(sessions) as s:
        for b, us in ((5, 5.0), (20, 50.0)):
            best_configs.upsert_best(
                session=s, row=best_configs.BestRow(ConfigKey(**{**KEY.__dict__, "bucket": b}), CFG, median_us=us)
            )
    with session_scope(sessions) as s:
        rows = best_configs.list_best_for(session=s, table=KEY.table)
        assert best_configs.nearest_row(rows, buckets.by_index(KEY.bucket)).key.bucket == 20  # 15: 5 from 20, 10 from 5
        assert best_configs.nearest_row(rows, buckets.by_index(9)).key.bucket == 5
        assert best_configs.nearest_row([], buckets.by_index(9)) is None


def test_batch_buckets_are_separate_keys(sessions):
    """The same (device, kernel, H, q_len, prefix bucket) holds one row per batch bucket; a B=1
    key's study name is the one it had before batch buckets existed (its study resumes)."""
    _record(sessions)
    b32 = ConfigKey(**{**KEY.__dict__, "batch_bucket": 5})
    with session_scope(sessions) as s:
        best_configs.upsert_best(session=s, row=best_configs.BestRow(KEY, CFG, median_us=10.0))
        best_configs.upsert_best(session=s, row=best_configs.BestRow(b32, KernelConfig(4, 8, 32, 256), median_us=90.0))
    with session_scope(sessions) as s:
        assert best_configs.get_best(session=s, key=KEY).config == CFG
        assert best_configs.get_best(session=s, key=b32).config.nsplit == 4
        only32 = best_configs.list_best_for(session=s, table=KEY.table, batch_bucket=5)
        assert [r.key for r in only32] == [b32]
        assert best_configs.delete_best(session=s, device=H200.name, batch_bucket=5) == 1
        assert [r.key for r in best_configs.list_best(session=s)] == [KEY]
    assert "|B" not in str(KEY) and str(b32).endswith("|B5")


def test_delete_filters(sessions):
    _record(sessions)
    with session_scope(sessions) as s:
        for b in (1, 2, 3):
            best_configs.upsert_best(
                session=s, row=best_configs.BestRow(ConfigKey(**{**KEY.__dict__, "bucket": b}), CFG, median_us=1.0)
            )
    with session_scope(sessions) as s:
        assert best_configs.delete_best(session=s, device=H200.name, bucket=2) == 1
        assert best_configs.delete_best(session=s, device="nope") == 0
    with session_scope(sessions) as s:
        assert [r.key.bucket for r in best_configs.list_best(session=s)] == [1, 3]


def test_study_and_trials_are_counted(sessions):
    _record(sessions)
    with session_scope(sessions) as s:
        st = studies.get_or_create_study(session=s, key=KEY, prefix=46000, sampler="tpe", seed=1)
        for state in ("ok", "invalid", "wrong", "crashed"):
            studies.record_trial(session=s, study_id=st.id, params=CFG.as_params(), state=state, reason=state)
    with session_scope(sessions) as s:
        again = studies.get_or_create_study(session=s, key=KEY, prefix=46000, sampler="tpe", seed=1)
        assert again.id == st.id and (again.n_trials, again.n_ok, again.n_invalid, again.n_failed) == (4, 1, 1, 2)
        assert [t.state for t in studies.list_trials(session=s, study_id=st.id)] == [
            "ok",
            "invalid",
            "wrong",
            "crashed",
        ]
        studies.finish_study(session=s, study_id=st.id)
    with session_scope(sessions) as s:
        assert s.get(models.Study, st.id).status == "finished"
        reopened = studies.get_or_create_study(session=s, key=KEY, prefix=46000, sampler="tpe", seed=1)
        assert reopened.status == "running"


def test_database_errors_become_storage_errors(sessions):
    with pytest.raises(StorageError, match="database error"), session_scope(sessions) as s:
        from sqlalchemy import text

        s.execute(text("select * from no_such_table"))


def test_recording_an_unchanged_device_does_not_turn_the_data_stamp_over(sessions):
    from dataclasses import replace

    from verify_tuner.store.data_version import data_stamp

    _record(sessions)
    with session_scope(sessions) as s:
        before = data_stamp(session=s)
    _record(sessions)  # what every study key and claim does
    with session_scope(sessions) as s:
        assert data_stamp(session=s) == before
        devices.upsert_device(session=s, limits=replace(H200, driver_version="99.0"))
    with session_scope(sessions) as s:
        assert data_stamp(session=s) != before
        assert devices.get_device(session=s, name=H200.name).driver_version == "99.0"
