"""`tuner db snapshot` from SQLite and from PostgreSQL: devices, best configs and graph plans, nothing else."""

from __future__ import annotations

import sqlite3

import pytest
from verify_tuner.errors import StorageError
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.keys import ConfigKey
from verify_tuner.store import best_configs, devices, migrate
from verify_tuner.store.session import make_engine, session_factory, session_scope
from verify_tuner.store.snapshot import write_snapshot

H200 = known_device("h200")


def test_snapshot_copies_devices_and_best_configs(db_url, tmp_path):
    migrate.upgrade(db_url)
    sessions = session_factory(make_engine(db_url))
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=H200)
        for bucket in (10, 15):
            best_configs.upsert_best(
                session=s,
                row=best_configs.BestRow(
                    ConfigKey(H200.name, "k" * 16, "bf16", 8, 9, bucket),
                    KernelConfig(132, 8, 32, 256),
                    median_us=70.0 + bucket,
                ),
            )
    dest = tmp_path / "snap.db"
    assert write_snapshot(db_url, dest) == 2
    con = sqlite3.connect(dest)
    try:
        assert con.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert con.execute("SELECT name FROM devices").fetchall() == [(H200.name,)]
        got = con.execute("SELECT bucket, nsplit, median_us FROM best_configs ORDER BY bucket").fetchall()
        assert got == [(10, 132, 80.0), (15, 132, 85.0)]
        assert con.execute("SELECT count(*) FROM tuning_studies").fetchone() == (0,)
    finally:
        con.close()
    with pytest.raises(StorageError, match="exists"):
        write_snapshot(db_url, dest)


def test_snapshot_keeps_stale_rows_marked_and_carries_the_graph_plans(sqlite_url, tmp_path):
    from verify_tuner.store import plans

    from tests.store.test_plans import PLAN, _split, _verification

    migrate.upgrade(sqlite_url)
    sessions = session_factory(make_engine(sqlite_url))
    keys = [ConfigKey(H200.name, "k" * 16, "bf16", 8, 9, b) for b in (10, 15)]
    cfg = KernelConfig(132, 8, 32, 256)
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=H200)
        for key in keys:
            best_configs.upsert_best(session=s, row=best_configs.BestRow(key, cfg, median_us=70.0))
        plans.store_plan_set(session=s, plans=_split(PLAN, 11))  # a set of two ranges
    with session_scope(sessions) as s:
        assert plans.record_verification(session=s, v=_verification(keys[1], cfg, "stale"))
    dest = tmp_path / "snap.db"
    assert write_snapshot(sqlite_url, dest) == 2
    con = sqlite3.connect(dest)
    try:
        got = con.execute("SELECT bucket, verdict, verified_at IS NOT NULL FROM best_configs ORDER BY bucket")
        assert got.fetchall() == [(10, None, 0), (15, "stale", 1)]
        got = con.execute("SELECT range_lo, range_hi, bucket_lo, bucket_hi FROM graph_plans ORDER BY range_lo")
        assert got.fetchall() == [(10, 10, 10, 12), (11, 12, 10, 12)]
        assert con.execute("SELECT count(*) FROM best_verifications").fetchone() == (0,)
    finally:
        con.close()
