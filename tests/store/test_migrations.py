from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from verify_tuner.errors import StorageError
from verify_tuner.store import migrate
from verify_tuner.store.models import Base
from verify_tuner.store.session import make_engine

TABLES = {
    "devices",
    "kernels",
    "tuning_studies",
    "tuning_trials",
    "best_configs",
    "data_version",
    "graph_plans",
    "best_verifications",
    "tuner_alembic_version",
}


def test_upgrade_from_empty_matches_the_models(db_url):
    engine = make_engine(db_url)
    with pytest.raises(StorageError, match="tuner db upgrade"):
        migrate.ensure_current(engine)
    migrate.upgrade(db_url)
    migrate.ensure_current(engine)
    assert TABLES <= set(inspect(engine).get_table_names())
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": migrate.VERSION_TABLE})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == [], f"migrations and models disagree: {diff}"
    engine.dispose()


def test_downgrade_upgrade_round_trip(db_url):
    engine = make_engine(db_url)
    migrate.upgrade(db_url)
    migrate.downgrade(db_url, "base")
    assert migrate.current_revision(engine) is None
    assert not (TABLES - {"tuner_alembic_version"}) & set(inspect(engine).get_table_names())
    migrate.upgrade(db_url)
    assert migrate.current_revision(engine) == migrate.head_revision()
    engine.dispose()


def test_own_version_table_leaves_optunas_alone(db_url):
    import optuna

    migrate.upgrade(db_url)
    optuna.create_study(storage=db_url, study_name="x")  # Optuna's schema, its own alembic_version
    engine = make_engine(db_url)
    names = set(inspect(engine).get_table_names())
    assert {"alembic_version", "tuner_alembic_version", "studies", "trials"} | TABLES <= names
    migrate.ensure_current(engine)
    engine.dispose()


def _old_device_and_kernel(conn, *, version: str) -> None:  # type: ignore[no-untyped-def]
    """The device and kernel rows an older schema's database holds, written with plain SQL."""
    from sqlalchemy import text

    conn.execute(
        text(
            "INSERT INTO devices (name, compute_capability, sm_count, max_smem_optin, smem_per_sm, "
            "regs_per_sm, regs_per_block, max_threads_per_block, l2_bytes, recorded_at) VALUES "
            "('NVIDIA H200', '9.0', 132, 232448, 233472, 65536, 65536, 1024, 0, '2026-11-01')"
        )
    )
    conn.execute(
        text("INSERT INTO kernels (source_hash, name, version) VALUES ('abc', 'verify_attention', :v)"), {"v": version}
    )


def test_0001_database_holding_rows_upgrades_and_back_keeping_them(db_url):
    """An operator's database from before 0002: every row survives the upgrade and a downgrade, and
    writes after the upgrade bump the version the sidecar's stamp reads."""
    from sqlalchemy import text
    from verify_tuner.kernels.config import KernelConfig
    from verify_tuner.keys import ConfigKey
    from verify_tuner.store import best_configs, data_version
    from verify_tuner.store.session import session_factory, session_scope

    migrate.upgrade(db_url, "0001")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        _old_device_and_kernel(conn, version="1")
        conn.execute(
            text(
                'INSERT INTO best_configs (device_id, kernel_id, dtype, "H", q_len, bucket, nsplit, ht, '
                "tk, block, extra, tuned_at) SELECT d.id, k.id, 'bf16', 8, 9, 15, 64, 8, 32, 256, "
                "'{\"STAGES\": 2}', '2026-11-01' FROM devices d, kernels k"
            )
        )
    migrate.upgrade(db_url)
    sessions = session_factory(engine)
    with session_scope(sessions) as s:
        assert [r.config.nsplit for r in best_configs.list_best(session=s)] == [64]
        before = data_version.data_stamp(session=s)
        best_configs.upsert_best(
            session=s,
            row=best_configs.BestRow(
                ConfigKey("NVIDIA H200", "abc", "bf16", 8, 9, 16),
                KernelConfig(nsplit=32, ht=8, tk=32, block=256),
                median_us=1.0,
            ),
        )
    with session_scope(sessions) as s:
        assert data_version.data_stamp(session=s)[0] == before[0] + 1
    migrate.downgrade(db_url, "0001")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM best_configs")).scalar_one() == 2
        assert "data_version" not in set(inspect(conn).get_table_names())
    engine.dispose()


def test_0002_database_with_rows_gains_batch_buckets_and_loses_nothing(db_url):
    """Migration 0003: a database tuned before batch buckets keeps every best config and study as
    batch bucket 0 (B=1), answers the same lookups, and can then store a B=32 row beside the B=1
    row of the same key; a downgrade keeps the B=1 rows and drops only the B=32 one."""
    from sqlalchemy import text
    from verify_tuner.kernels.config import KernelConfig
    from verify_tuner.keys import ConfigKey
    from verify_tuner.store import best_configs, studies
    from verify_tuner.store.session import session_factory, session_scope

    migrate.upgrade(db_url, "0002")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        _old_device_and_kernel(conn, version="2")
        for bucket, nsplit in ((15, 64), (16, 132), (9, 33)):
            conn.execute(
                text(
                    'INSERT INTO best_configs (device_id, kernel_id, dtype, "H", q_len, bucket, nsplit, '
                    f"ht, tk, block, extra, tuned_at) SELECT d.id, k.id, 'bf16', 8, 9, {bucket}, {nsplit}, "
                    "8, 32, 256, '{\"STAGES\": 2}', '2026-11-01' FROM devices d, kernels k"
                )
            )
        conn.execute(
            text(
                'INSERT INTO tuning_studies (workload_key, device_id, kernel_id, dtype, "H", q_len, bucket, '
                "prefix, status, sampler, started_at, n_trials, n_ok, n_invalid, n_failed) SELECT "
                "'NVIDIA H200|abc|bf16|H8|Q9|b16', d.id, k.id, 'bf16', 8, 9, 16, 46000, 'finished', 'tpe', "
                "'2026-11-01', 40, 38, 2, 0 FROM devices d, kernels k"
            )
        )
        conn.execute(
            text(
                "INSERT INTO tuning_trials (study_id, params, state, created_at) SELECT id, "
                "'{\"NSPLIT\": 132}', 'ok', '2026-11-01' FROM tuning_studies"
            )
        )
    migrate.upgrade(db_url)
    sessions = session_factory(engine)
    key1 = ConfigKey("NVIDIA H200", "abc", "bf16", 8, 9, 16)
    with session_scope(sessions) as s:
        rows = best_configs.list_best(session=s)
        assert sorted((r.key.bucket, r.key.batch_bucket, r.config.nsplit) for r in rows) == [
            (9, 0, 33),
            (15, 0, 64),
            (16, 0, 132),
        ]
        assert best_configs.get_best(session=s, key=key1).config.nsplit == 132
        study = studies.get_or_create_study(session=s, key=key1, prefix=46000, sampler="tpe", seed=None)
        assert (study.n_trials, study.batch_bucket) == (40, 0)  # the old study resumes, not a new one
        assert len(studies.list_trials(session=s, study_id=study.id)) == 1
        best_configs.upsert_best(
            session=s,
            row=best_configs.BestRow(
                ConfigKey(**{**key1.__dict__, "batch_bucket": 5}),
                KernelConfig(nsplit=4, ht=8, tk=32, block=256),
                median_us=90.0,
            ),
        )
    with session_scope(sessions) as s:
        assert best_configs.get_best(session=s, key=key1).config.nsplit == 132
        assert len(best_configs.list_best(session=s)) == 4
    migrate.downgrade(db_url, "0002")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM best_configs")).scalar_one() == 3
        assert conn.execute(text("SELECT count(*) FROM tuning_trials")).scalar_one() == 1
        assert "batch_bucket" not in {c["name"] for c in inspect(conn).get_columns("best_configs")}
    migrate.upgrade(db_url)
    with session_scope(sessions) as s:
        assert len(best_configs.list_best(session=s)) == 3
    engine.dispose()


def test_0004_database_with_rows_gains_neighbour_mb_and_a_downgrade_drops_only_cold_rows(db_url):
    """Migration 0005: a database tuned back to back keeps every row as neighbour_mb 0 and its study
    resumes; a cold study is a study of its own; a downgrade drops the cold rows and their trials
    (none left pointing at a study that is gone) and keeps the back-to-back ones."""
    from sqlalchemy import text
    from verify_tuner.kernels.config import KernelConfig
    from verify_tuner.keys import ConfigKey
    from verify_tuner.store import best_configs, studies
    from verify_tuner.store.session import session_factory, session_scope

    migrate.upgrade(db_url, "0004")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        _old_device_and_kernel(conn, version="6")
        conn.execute(
            text(
                'INSERT INTO best_configs (device_id, kernel_id, dtype, "H", q_len, bucket, batch_bucket, nsplit, '
                "ht, tk, block, extra, median_us, tuned_at) SELECT d.id, k.id, 'bf16', 8, 9, 16, 0, 132, 8, 32, 256, "
                "'{}', 42.0, '2026-12-01' FROM devices d, kernels k"
            )
        )
        conn.execute(
            text(
                'INSERT INTO tuning_studies (workload_key, device_id, kernel_id, dtype, "H", q_len, bucket, '
                "batch_bucket, prefix, status, sampler, started_at, n_trials, n_ok, n_invalid, n_failed) SELECT "
                "'NVIDIA H200|abc|bf16|H8|Q9|b16', d.id, k.id, 'bf16', 8, 9, 16, 0, 46000, 'finished', 'tpe', "
                "'2026-12-01', 20, 20, 0, 0 FROM devices d, kernels k"
            )
        )
        conn.execute(
            text(
                "INSERT INTO tuning_trials (study_id, params, state, created_at) SELECT id, "
                "'{\"NSPLIT\": 132}', 'ok', '2026-12-01' FROM tuning_studies"
            )
        )
    migrate.upgrade(db_url)
    sessions = session_factory(engine)
    key = ConfigKey("NVIDIA H200", "abc", "bf16", 8, 9, 16)
    with session_scope(sessions) as s:
        (row,) = best_configs.list_best(session=s)
        assert (row.neighbour_mb, row.median_us) == (0, 42.0)
        warm = studies.get_or_create_study(session=s, key=key, prefix=46000, sampler="tpe", seed=None)
        assert (warm.n_trials, warm.neighbour_mb) == (20, 0)  # the old study resumes
        cold = studies.get_or_create_study(session=s, key=key, prefix=46000, sampler="tpe", seed=None, neighbour_mb=128)
        assert cold.id != warm.id and cold.workload_key.endswith("|N128")
        s.flush()
        s.execute(
            text(
                "INSERT INTO tuning_trials (study_id, params, state, created_at) VALUES (:i, '{}', 'ok', '2026-12-03')"
            ),
            {"i": cold.id},
        )
        best_configs.upsert_best(
            session=s,
            row=best_configs.BestRow(
                ConfigKey(**{**key.__dict__, "bucket": 15}),
                KernelConfig(nsplit=128, ht=8, tk=32, block=256),
                median_us=40.0,
                neighbour_mb=128,
            ),
        )
    migrate.downgrade(db_url, "0004")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT bucket FROM best_configs")).scalars().all() == [16]
        assert conn.execute(text("SELECT workload_key FROM tuning_studies")).scalars().all() == [str(key)]
        orphans = "SELECT count(*) FROM tuning_trials WHERE study_id NOT IN (SELECT id FROM tuning_studies)"
        assert conn.execute(text(orphans)).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM tuning_trials")).scalar_one() == 1
    engine.dispose()


def test_sixteen_concurrent_db_upgrades_on_a_fresh_database_all_succeed(db_url, tmp_path):
    """Operators start tuners and sidecars together: each runs `tuner db upgrade` first (it also
    creates Optuna's tables). Before the lock 2 of 16 failed on PostgreSQL, 1 of 16 on SQLite."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TUNER_DATABASE_URL": db_url}
    env.pop("TUNER_STUDY_STORAGE", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tuner", "db", "upgrade"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(16)
    ]
    outcomes = [(p.wait(timeout=180), p.stderr.read()) for p in procs]
    failed = [err for rc, err in outcomes if rc != 0]
    assert not failed, f"{len(failed)} of 16 failed: {failed[0][-800:]}"
    engine = make_engine(db_url)
    assert migrate.current_revision(engine) == migrate.head_revision()
    tables = set(inspect(engine).get_table_names())
    engine.dispose()
    from sqlalchemy.engine import make_url
    from verify_tuner.settings import Settings

    studies = Settings(database_url=db_url).studies
    if studies == db_url:  # PostgreSQL: Optuna's tables in the config database, created once
        assert {"studies", "trials"} <= tables
    else:  # SQLite: a file per key, created when the key is first tuned; upgrade made the directory
        assert not {"studies", "trials"} & tables
        assert Path(make_url(studies).database).parent.is_dir()


def test_autogenerate_ignores_optunas_tables(db_url):
    """`alembic revision --autogenerate` against a database holding Optuna's tables must not emit
    drops of them: the environment's filter (migrate.include_name) keeps to our tables."""
    import optuna

    migrate.upgrade(db_url)
    optuna.create_study(storage=db_url, study_name="shares-the-database")
    engine = make_engine(db_url)
    with engine.connect() as conn:
        unfiltered = compare_metadata(
            MigrationContext.configure(conn, opts={"version_table": migrate.VERSION_TABLE}), Base.metadata
        )
        filtered = compare_metadata(
            MigrationContext.configure(
                conn, opts={"version_table": migrate.VERSION_TABLE, "include_name": migrate.include_name}
            ),
            Base.metadata,
        )
    engine.dispose()
    assert any(d[0] == "remove_table" for d in unfiltered)  # what autogenerate would have emitted
    assert filtered == [], filtered


def _rows_of_0005(conn, kv: str, bucket: int, at: str = "0005") -> None:  # type: ignore[no-untyped-def]
    """A study with a trial, its best, a graph plan and a verification, as schema `at` holds them
    (the format in `dtype`; from 0006 on, `kv_dtype`; from 0007 on, a plan has its own range),
    written with plain SQL."""
    from sqlalchemy import text

    col = "dtype" if at < "0006" else "kv_dtype"
    ranges = at >= "0007"
    params = '{"NSPLIT": 132, "HT": 8, "TK": 32, "BLOCK": 256}'
    key = f'device_id, kernel_id, {col}, "H", q_len'
    of = "FROM devices d, kernels k"
    conn.execute(
        text(
            f"INSERT INTO tuning_studies (workload_key, {key}, bucket, batch_bucket, prefix, status, sampler, "
            f"started_at, n_trials, n_ok, n_invalid, n_failed) SELECT 'NVIDIA H200|abc|{kv}|H8|Q9|b{bucket}', "
            f"d.id, k.id, '{kv}', 8, 9, {bucket}, 0, 46000, 'finished', 'tpe', '2026-12-01', 20, 20, 0, 0 {of}"
        )
    )
    study = f"(SELECT id FROM tuning_studies WHERE workload_key LIKE '%|{kv}|%')"
    conn.execute(
        text(
            f"INSERT INTO tuning_trials (study_id, params, state, created_at) SELECT {study}, '{{}}', 'ok', '2026-12-01'"
        )
    )
    conn.execute(
        text(
            f"INSERT INTO best_configs ({key}, bucket, batch_bucket, nsplit, ht, tk, block, extra, median_us, "
            f"study_id, tuned_at) SELECT d.id, k.id, '{kv}', 8, 9, {bucket}, 0, 132, 8, 32, 256, '{{}}', 42.0, "
            f"{study}, '2026-12-01' {of}"
        )
    )
    own, own_values = (", range_lo, range_hi", ", 15, 16") if ranges else ("", "")
    conn.execute(
        text(
            f"INSERT INTO graph_plans ({key}, batch_bucket, bucket_lo, bucket_hi, weights_digest, weights, params, "
            f"expected_us, per_bucket, finalists, batch, spread, rounds, measured_by, measured_at{own}) SELECT d.id, "
            f"k.id, '{kv}', 8, 9, 0, 15, 16, '{kv}', '{{}}', '{params}', 40.0, '[]', '[]', 1, 'uniform', 3, "
            f"'a test', '2026-12-01'{own_values} {of}"
        )
    )
    conn.execute(
        text(
            f"INSERT INTO best_verifications ({key}, bucket, batch_bucket, params, heuristic_params, verdict, "
            f"reason, measured_by, verified_at) SELECT d.id, k.id, '{kv}', 8, 9, {bucket}, 0, "
            f"'{params}', '{params}', 'ok', 'faster', 'a test', '2026-12-02' {of}"
        )
    )


def test_0005_database_with_rows_upgrades_to_kv_dtype_bf16_and_back(db_url):
    """Migration 0006: every keyed table's `dtype` becomes `kv_dtype`. A database tuned before keeps
    every row as bf16: the same lookups answer, its study resumes (study names carried the value
    already), its plans and verifications read back; a row stored without the column is bf16. A
    downgrade keeps those rows and drops the rows of other formats with their studies' trials (the
    older schema reads every row as bf16)."""
    from sqlalchemy import text
    from verify_tuner.keys import ConfigKey
    from verify_tuner.store import best_configs, plans, studies
    from verify_tuner.store.session import session_factory, session_scope

    migrate.upgrade(db_url, "0005")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        _old_device_and_kernel(conn, version="7")
        _rows_of_0005(conn, "bf16", 16)
    migrate.upgrade(db_url)
    key = ConfigKey("NVIDIA H200", "abc", "bf16", 8, 9, 16)
    sessions = session_factory(engine)
    with session_scope(sessions) as s:
        (row,) = best_configs.list_best(session=s)
        assert (row.key, row.median_us) == (key, 42.0)
        assert best_configs.get_best(session=s, key=key) == row
        study = studies.get_or_create_study(session=s, key=key, prefix=46000, sampler="tpe", seed=None)
        assert (study.n_trials, study.kv_dtype, study.workload_key) == (20, "bf16", str(key))  # it resumes
        (plan,) = plans.list_plans(session=s)
        assert plan.table == key.table and plans.served_sets(session=s, table=key.table)[0].ranges == (plan,)
        assert [v.key for v in plans.list_verifications(session=s)] == [key]
    with engine.begin() as conn:  # a writer that does not name the column (an older tool's INSERT)
        conn.execute(
            text(
                'INSERT INTO best_configs (device_id, kernel_id, "H", q_len, bucket, batch_bucket, nsplit, ht, tk, '
                "block, extra, tuned_at) SELECT d.id, k.id, 8, 9, 3, 0, 64, 8, 32, 256, '{}', '2026-12-03' "
                "FROM devices d, kernels k"
            )
        )
        assert conn.execute(text("SELECT kv_dtype FROM best_configs WHERE bucket = 3")).scalar_one() == "bf16"
        _rows_of_0005(conn, "fp8_e4m3", 15, at="0007")  # what a later kernel stores: the downgrade must drop it
    migrate.downgrade(db_url, "0005")
    with engine.connect() as conn:
        for table in ("best_configs", "tuning_studies", "graph_plans", "best_verifications"):
            assert conn.execute(text(f"SELECT DISTINCT dtype FROM {table}")).scalars().all() == ["bf16"], table
        assert conn.execute(text("SELECT workload_key FROM tuning_studies")).scalars().all() == [str(key)]
        assert conn.execute(text("SELECT count(*) FROM tuning_trials")).scalar_one() == 1
        assert sorted(conn.execute(text("SELECT bucket FROM best_configs")).scalars()) == [3, 16]
    engine.dispose()


def test_0006_database_with_a_plan_upgrades_to_a_set_of_one_and_back(db_url):
    """Migration 0007: a graph plan stored before ranges is a set of one range spanning the range it
    was measured over, served as it was; a set of two ranges is stored beside it. A downgrade drops
    the set of two (the older schema would serve each of its rows as a whole-range plan) and keeps
    the set of one, under the older unique key."""
    from dataclasses import replace

    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError
    from verify_tuner.keys import ConfigKey
    from verify_tuner.store import plans
    from verify_tuner.store.session import session_factory, session_scope

    migrate.upgrade(db_url, "0006")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        _old_device_and_kernel(conn, version="8")
        _rows_of_0005(conn, "bf16", 16, at="0006")  # its plan: buckets 15..16 of batch bucket 0
    migrate.upgrade(db_url)
    table = ConfigKey("NVIDIA H200", "abc", "bf16", 8, 9, 16).table
    sessions = session_factory(engine)
    with session_scope(sessions) as s:
        (old,) = plans.list_plans(session=s)
        assert (old.range_lo, old.range_hi, old.max_graphs, old.by_count) == (15, 16, 1, [])
        assert plans.served_sets(session=s, table=table)[0].ranges == (old,)
        two = [
            replace(old, batch_bucket=3, bucket_lo=5, range_lo=5, range_hi=9, max_graphs=2, by_count=[9.0, 8.0]),
            replace(old, batch_bucket=3, bucket_lo=5, range_lo=10, max_graphs=2, by_count=[9.0, 8.0]),
        ]
        plans.store_plan_set(session=s, plans=two)
    with session_scope(sessions) as s:
        served = plans.served_sets(session=s, table=table)
        assert len(served[3].ranges) == 2 and served[0].ranges == (old,)
    migrate.downgrade(db_url, "0006")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT batch_bucket, bucket_lo, bucket_hi FROM graph_plans")).all()
        assert [tuple(r) for r in rows] == [(0, 15, 16)]
        assert "range_lo" not in {c["name"] for c in inspect(conn).get_columns("graph_plans")}
    with pytest.raises(IntegrityError), engine.begin() as conn:  # the older key: one plan a range and weights
        conn.execute(text("INSERT INTO graph_plans SELECT * FROM graph_plans"))
    migrate.upgrade(db_url)
    with session_scope(sessions) as s:
        assert [(p.range_lo, p.range_hi) for p in plans.list_plans(session=s)] == [(15, 16)]
    engine.dispose()
