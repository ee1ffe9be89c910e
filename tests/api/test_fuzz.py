"""Property-based fuzzing of the lookup endpoints: no 500s, every 4xx names what is wrong."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verify_tuner.api.app import create_app
from verify_tuner.settings import Settings
from verify_tuner.store import migrate

values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.text(max_size=12),
    st.floats(allow_nan=True),
    st.sampled_from(["", "8", "bf16", "h200", "NVIDIA H200", "rtx-pro-6000", "1e3", "0x10"]),
)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'c.db'}"
    migrate.upgrade(url)
    with TestClient(create_app(Settings(database_url=url, device="h200"))) as c:
        yield c


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=st.dictionaries(st.sampled_from(["H", "q_len", "prefix", "device", "kv_dtype", "dtype", "junk"]), values))
def test_config_never_500(client, params):
    for path in ("/config", "/configs"):
        r = client.get(path, params={k: str(v) for k, v in params.items()})
        assert r.status_code in (200, 422), (path, params, r.status_code, r.text)
        if r.status_code == 422:
            detail = r.json()["detail"]
            assert detail and all(d["loc"][0] == "query" and d["msg"] for d in detail)


def test_openapi_documents_the_parameters(client):
    spec = client.get("/openapi.json").json()
    names = {p["name"] for p in spec["paths"]["/config"]["get"]["parameters"]}
    assert {"H", "q_len", "prefix", "device", "kv_dtype", "kernel_hash", "dtype"} <= names
