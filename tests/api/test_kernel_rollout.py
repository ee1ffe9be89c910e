"""Issue 30 items 13 and 14 against a real `tuner serve`: a fleet mid-rollout of two kernel
versions asks for its own kernel's table (or gets a 404 naming what the sidecar holds, which the
worker client reports as a refusal, not an outage); the client counts tuned entries and refreshes
its table with If-None-Match."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from verify_tuner import batches, buckets
from verify_tuner.engine.client import ConfigClient
from verify_tuner.kernels import kernel_hash

from tests.helpers import free_port, running_server, tuner_cmd

OTHER = "feedc0de00000000"  # the kernel of the next release, tuned elsewhere and imported here
UNKNOWN = "0123456789abcdef"
ENTRIES = len(buckets.ALL) * len(batches.ALL)


def _import(env: dict[str, str], path, rows: list[dict]) -> None:  # type: ignore[no-untyped-def]
    path.write_text(json.dumps(rows))
    cmd = tuner_cmd("configs", "import", str(path))
    subprocess.run(cmd, env={**os.environ, **env}, check=True, capture_output=True, timeout=60)


def _row(nsplit: int, prefix: int = 46000) -> dict:
    return {
        "device": "h200",
        "H": 8,
        "q_len": 9,
        "prefix": prefix,
        "NSPLIT": nsplit,
        "HT": 8,
        "TK": 32,
        "BLOCK": 256,
        "STAGES": 2,
        "QT": 0,
        "WR": 2,
        "WK": 4,
        "SF": 0,
        "PIPE": 1,
    }


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory) -> Iterator[tuple[str, dict[str, str], object]]:
    """A sidecar whose database holds one tuned row for its own kernel (NSPLIT 64) and one for OTHER (NSPLIT 32)."""
    tmp = tmp_path_factory.mktemp("rollout")
    env = {"TUNER_DATABASE_URL": f"sqlite:///{tmp / 'c.db'}", "TUNER_DEVICE": "h200"}
    subprocess.run(tuner_cmd("db", "upgrade"), env={**os.environ, **env}, check=True, timeout=60)
    _import(env, tmp / "own.json", [_row(64)])
    _import(env, tmp / "other.json", [{**_row(32), "kernel_hash": OTHER}])
    port = free_port()
    with running_server(env, port=port):
        yield f"http://127.0.0.1:{port}", env, tmp


def test_config_and_configs_answer_for_the_kernel_asked(sidecar):
    base, _, _ = sidecar
    q = "H=8&q_len=9&prefix=46000"
    own = httpx.get(f"{base}/config?{q}").json()
    other = httpx.get(f"{base}/config?{q}&kernel_hash={OTHER}").json()
    assert (own["kernel_hash"], own["NSPLIT"], own["source"]) == (kernel_hash(), 64, "tuned")
    assert (other["kernel_hash"], other["NSPLIT"], other["source"]) == (OTHER, 32, "tuned")
    table = httpx.get(f"{base}/configs?H=8&q_len=9&all_batches=true&kernel_hash={OTHER}")
    assert table.status_code == 200 and table.json()["kernel_hash"] == OTHER
    assert {c["kernel_hash"] for c in table.json()["configs"]} == {OTHER}


@pytest.mark.parametrize("path", ["/config?H=8&q_len=9&prefix=46000", "/configs?H=8&q_len=9&all_batches=true"])
def test_a_kernel_the_sidecar_holds_nothing_for_is_a_404_naming_what_it_holds(sidecar, path):
    base, _, _ = sidecar
    r = httpx.get(f"{base}{path}&kernel_hash={UNKNOWN}")
    detail = r.json()["detail"]
    assert r.status_code == 404 and UNKNOWN in detail and OTHER in detail and kernel_hash() in detail, detail


def test_a_kernel_hash_with_a_control_character_is_a_422_naming_it(sidecar):
    base, _, _ = sidecar
    r = httpx.get(f"{base}/config?H=8&q_len=9&prefix=1&kernel_hash=ab%0Acd")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "kernel_hash"]


def test_a_worker_of_a_kernel_the_sidecar_lacks_reports_a_refusal_not_an_outage(sidecar, tmp_path):
    base, _, _ = sidecar
    c = ConfigClient(base, H=8, q_len=9, device="NVIDIA H200", snapshot_dir=tmp_path, kernel_hash=UNKNOWN)
    assert c.fetch() == "heuristic"
    assert f"sidecar at {base} refused this worker's request (HTTP 404: no configs for kernel_hash" in c.reason
    assert "sidecar unavailable" not in c.reason, c.reason
    nxt = ConfigClient(base, H=8, q_len=9, device="NVIDIA H200", snapshot_dir=tmp_path, kernel_hash=OTHER)
    assert nxt.fetch() == "sidecar" and nxt.lookup(46000).nsplit == 32, nxt.reason


def test_the_client_counts_tuned_entries(sidecar, tmp_path):
    base, _, _ = sidecar
    tuned = ConfigClient(base, H=8, q_len=9, device="NVIDIA H200", snapshot_dir=tmp_path)
    guessed = ConfigClient(base, H=16, q_len=1, device="NVIDIA H200", snapshot_dir=tmp_path)
    assert tuned.fetch() == "sidecar" and guessed.fetch() == "sidecar"
    assert tuned.tuned == 1 and tuned.counts["nearest"] > 0
    assert f"1 of {ENTRIES} entries tuned" in tuned.reason, tuned.reason
    assert guessed.tuned == 0 and guessed.counts == {"tuned": 0, "nearest": 0, "heuristic": ENTRIES}
    assert f"0 of {ENTRIES} entries tuned" in guessed.reason, guessed.reason


def test_refresh_asks_with_the_etag_and_keeps_the_table_when_the_sidecar_is_gone(tmp_path):
    env = {"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}", "TUNER_DEVICE": "h200"}
    subprocess.run(tuner_cmd("db", "upgrade"), env={**os.environ, **env}, check=True, timeout=60)
    _import(env, tmp_path / "a.json", [_row(64)])
    port = free_port()
    with running_server(env, port=port):
        c = ConfigClient(f"http://127.0.0.1:{port}", H=8, q_len=9, device="h200", snapshot_dir=tmp_path, timeout_s=2)
        assert c.fetch() == "sidecar" and c.etag and c.tuned == 1
        assert c.refresh() == "unchanged"  # only a 304 (an If-None-Match the sidecar matched) says so
        _import(env, tmp_path / "b.json", [_row(16, prefix=1000)])
        deadline = time.monotonic() + 10
        while (state := c.refresh()) == "unchanged" and time.monotonic() < deadline:
            time.sleep(0.05)  # the sidecar sees another process's import within its re-check interval
        assert state == "updated" and c.tuned == 2 and c.lookup(1000).nsplit == 16, (state, c.refresh_error)
    assert c.refresh() == "failed" and "sidecar unavailable" in c.refresh_error
    assert c.source == "sidecar" and c.lookup(1000).nsplit == 16 and c.lookup(46000).nsplit == 64
