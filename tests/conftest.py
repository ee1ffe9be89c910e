from __future__ import annotations

import os

import pytest


def _has_gpu() -> bool:
    try:
        import pycuda.driver as cuda

        cuda.init()
        return cuda.Device.count() > 0
    except Exception:  # no pycuda, no driver, no device: all mean "no GPU here"
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _has_gpu():
        skip = pytest.mark.skip(reason="needs a CUDA GPU with PyCUDA (run on the device: see README)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def pg_url() -> str:
    """PostgreSQL URL for the tests that need one; skip when unset and unreachable."""
    url = os.environ.get("TUNER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    try:
        import sqlalchemy as sa

        engine = sa.create_engine(url)
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
        engine.dispose()
    except Exception as exc:
        if os.environ.get("TUNER_REQUIRE_POSTGRES"):
            raise
        pytest.skip(f"PostgreSQL not reachable at {url}: {exc}")
    return url
