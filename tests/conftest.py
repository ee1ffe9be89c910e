from __future__ import annotations

import os

import pytest

#: The suite exercises every format the kernel reads, withheld ones too (a withheld format's refusal
#: in a process without this: tests/kernels/test_formats.py and tests/api/test_api.py).
os.environ.setdefault("VERIFY_TUNER_RUN_WITHHELD", "fp8_ds_mla")

PG_URL = os.environ.get("TUNER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _has_gpu() -> bool:
    try:
        import pycuda.driver as cuda

        cuda.init()
        return cuda.Device.count() > 0
    except Exception:  # noqa: BLE001 -- no pycuda, no driver, no device: all mean "no GPU here"
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _has_gpu():
        skip = pytest.mark.skip(reason="needs a CUDA GPU with PyCUDA (run on the device: see README)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def reset_postgres(url: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP SCHEMA IF EXISTS public CASCADE"))
        conn.execute(sa.text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture
def pg_url() -> str:
    """A PostgreSQL database emptied for this test. Skips when none is reachable, unless
    TUNER_REQUIRE_POSTGRES is set (CI sets it, so those tests cannot silently skip there)."""
    try:
        reset_postgres(PG_URL)
    except Exception as exc:
        if os.environ.get("TUNER_REQUIRE_POSTGRES"):
            raise
        pytest.skip(f"PostgreSQL not reachable at {PG_URL}: {exc}")
    return PG_URL


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'configs.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """Every storage test runs against real SQLite and real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'configs.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def sessions(db_url):
    from verify_tuner.store import migrate
    from verify_tuner.store.session import make_engine, session_factory

    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    yield session_factory(engine)
    engine.dispose()


@pytest.fixture(autouse=True, scope="session")
def _quiet_optuna():
    try:
        import optuna
    except ImportError:
        return
    optuna.logging.set_verbosity(optuna.logging.ERROR)
