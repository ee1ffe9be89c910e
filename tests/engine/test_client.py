"""The worker client: sidecar, then snapshot, then heuristic; lookups with no I/O."""

from __future__ import annotations

import json

import pytest
from verify_tuner.engine.client import ConfigClient
from verify_tuner.kernels.limits import known_device
from verify_tuner.kernels.validate import check

from tests.helpers import free_port, running_server


def _sidecar_env_with_one_tuned_row(tmp_path, url: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """A migrated config database holding one tuned H=8 q=9 row (imported through the CLI, in
    processes, as an operator does); the environment a `tuner serve` on it needs."""
    import os
    import subprocess
    import sys

    env = {"TUNER_DATABASE_URL": url, "TUNER_DEVICE": "h200"}
    full = {**os.environ, **env}
    subprocess.run([sys.executable, "-m", "tuner", "db", "upgrade"], env=full, check=True, capture_output=True)
    rows = [
        {
            "device": "h200",
            "H": 8,
            "q_len": 9,
            "prefix": 46000,
            "NSPLIT": 64,
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
    ]
    (tmp_path / "r.json").write_text(json.dumps(rows))
    subprocess.run(
        [sys.executable, "-m", "tuner", "configs", "import", str(tmp_path / "r.json")],
        env=full,
        check=True,
        capture_output=True,
    )
    return env


def test_fetch_from_sidecar_then_snapshot_then_heuristic(tmp_path):
    env = _sidecar_env_with_one_tuned_row(tmp_path, f"sqlite:///{tmp_path / 'c.db'}")
    port = free_port()
    snap = tmp_path / "snap"
    with running_server(env, port=port):
        c = ConfigClient(f"http://127.0.0.1:{port}", H=8, q_len=9, device="NVIDIA H200", snapshot_dir=snap)
        assert c.fetch() == "sidecar"
        assert c.lookup(46000).nsplit == 64 and c.lookup(60000).nsplit == 64  # tuned + nearest (one octave)
        assert c.snapshot.exists()
    # sidecar gone: the snapshot answers the same
    c2 = ConfigClient(f"http://127.0.0.1:{port}", H=8, q_len=9, device="NVIDIA H200", snapshot_dir=snap, timeout_s=0.5)
    assert c2.fetch() == "snapshot" and "sidecar unavailable" in c2.reason
    assert c2.lookup(46000) == c.lookup(46000)
    # the same snapshot under the name a worker spelling its device `h200` reads: one device, used
    alias = ConfigClient(f"http://127.0.0.1:{port}", H=8, q_len=9, device="h200", snapshot_dir=snap, timeout_s=0.5)
    assert alias.snapshot == c.snapshot  # the device's own name in the file's, however the worker spells it
    assert alias.fetch() == "snapshot" and alias.lookup(46000) == c.lookup(46000)
    # a snapshot copied from another GPU's host, or made for another dtype, is not trusted
    table = json.loads(c.snapshot.read_text())
    for changed, why in (
        ({"device": "NVIDIA L40S"}, "is for device 'NVIDIA L40S'"),
        ({"kv_dtype": "fp8"}, "is for kv_dtype 'fp8'"),
    ):
        c.snapshot.write_text(json.dumps(table | changed))
        other = ConfigClient(
            f"http://127.0.0.1:{port}", H=8, q_len=9, device="NVIDIA H200", snapshot_dir=snap, timeout_s=0.5
        )
        assert other.fetch() == "heuristic" and why in other.reason, other.reason
    # no snapshot either: the heuristic, valid for the device
    c3 = ConfigClient(
        f"http://127.0.0.1:{port}", H=8, q_len=9, device="h200", snapshot_dir=tmp_path / "none", timeout_s=0.5
    )
    assert c3.fetch() == "heuristic" and "heuristic" in c3.reason
    for prefix in (0, 300, 46000, 1 << 20):
        assert check(c3.lookup(prefix), known_device("h200"), H=8, q_len=9) is None


def test_corrupt_snapshot_is_not_trusted(tmp_path):
    c = ConfigClient("http://127.0.0.1:1", H=8, q_len=9, device="h200", snapshot_dir=tmp_path, timeout_s=0.2)
    c.snapshot.parent.mkdir(parents=True, exist_ok=True)
    c.snapshot.write_text('{"H": 8, "q_len": 9, "configs": []}')
    assert c.fetch() == "heuristic" and "no usable snapshot" in c.reason


def test_lookup_is_a_local_bisect(tmp_path):
    c = ConfigClient("http://127.0.0.1:1", H=16, q_len=1, device="h200", snapshot_dir=tmp_path, timeout_s=0.2)
    c.fetch()
    import socket

    real = socket.socket
    socket.socket = None  # any network use inside lookup() would now fail
    try:
        cfgs = {c.lookup(p) for p in range(0, 200_000, 997)}
    finally:
        socket.socket = real
    assert cfgs <= set(c.distinct_configs())


def test_an_unwritable_snapshot_dir_keeps_the_sidecars_table(tmp_path, sqlite_url):
    """The worker runs as a user who cannot write the snapshot dir: the good table is still used."""
    env = _sidecar_env_with_one_tuned_row(tmp_path, sqlite_url)
    blocked = tmp_path / "a-file-not-a-dir"
    blocked.write_text("")  # mkdir under a regular file fails for every user, root included
    port = free_port()
    with running_server(env, port=port):
        c = ConfigClient(f"http://127.0.0.1:{port}", H=8, q_len=9, device="NVIDIA H200", snapshot_dir=blocked / "x")
        assert c.fetch() == "sidecar"
        assert "snapshot not saved" in c.reason and c.lookup(46000).nsplit == 64


def test_an_unknown_device_is_a_state_not_an_exception(tmp_path):
    c = ConfigClient("http://127.0.0.1:1", H=8, q_len=9, device="Some Future GPU", snapshot_dir=tmp_path, timeout_s=0.2)
    assert c.fetch() == "none" and c.source == "none"
    assert "unknown" in c.reason and "sidecar unavailable" in c.reason
    with pytest.raises(RuntimeError, match="no config table"):
        c.lookup(1000)


def test_a_shape_no_config_fits_is_a_state_not_an_exception(tmp_path):
    """A device whose shared memory no template fits: fetch() says so instead of raising from the
    heuristic (it promises never to raise)."""
    from dataclasses import replace

    tiny = replace(known_device("h200"), max_smem_optin=8 << 10)
    c = ConfigClient(None, H=8, q_len=9, device="NVIDIA H200", limits=tiny, snapshot_dir=tmp_path)
    assert c.fetch() == "none"
    assert "no heuristic either: no kernel config fits NVIDIA H200 for H=8, q_len=9" in c.reason


def test_each_kernel_keeps_its_own_snapshot(tmp_path):
    """Two package versions on one host (a canary) share the snapshot folder: the newer one's table
    must not replace the older one's, which it would refuse after a restart without the sidecar."""
    a = ConfigClient(None, H=8, q_len=9, device="h200", snapshot_dir=tmp_path, kernel_hash="a" * 16)
    b = ConfigClient(None, H=8, q_len=9, device="h200", snapshot_dir=tmp_path, kernel_hash="b" * 16)
    assert a.snapshot != b.snapshot and a.snapshot.parent == b.snapshot.parent


def test_the_default_snapshot_lives_in_the_per_user_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    c = ConfigClient("http://127.0.0.1:1", H=8, q_len=9, device="h200")
    assert c.snapshot.is_relative_to(tmp_path / "xdg") and "verify-tuner" in str(c.snapshot)


def test_lookup_by_batch_uses_that_batch_buckets_table(tmp_path):
    """fetch() gets every batch bucket in one request; lookup(prefix, batch) bisects the table of
    the batch's bucket, and the snapshot keeps all of them."""
    env = _sidecar_env_with_one_tuned_row(tmp_path, f"sqlite:///{tmp_path / 'c.db'}")
    port = free_port()
    with running_server(env, port=port):
        c = ConfigClient(f"http://127.0.0.1:{port}", H=8, q_len=9, device="NVIDIA H200", snapshot_dir=tmp_path)
        assert c.fetch() == "sidecar"
    assert c.lookup(46000).nsplit == c.lookup(46000, batch=1).nsplit == 64  # the tuned B=1 row
    h200 = known_device("h200")
    for batch in (2, 8, 32, 256, 4096):
        cfg = c.lookup(46000, batch=batch)
        assert check(cfg, h200, H=8, q_len=9) is None
        assert cfg.nsplit <= 2 * h200.sm_count  # the grid does not grow with the batch
    assert c.lookup(46000, batch=17) == c.lookup(46000, batch=32)
    with pytest.raises(ValueError, match="batch"):
        c.lookup(46000, batch=0)
    snap = json.loads(c.snapshot.read_text())
    assert len({cfg["batch_bucket"]["index"] for cfg in snap["configs"]}) == 13


@pytest.mark.parametrize(("kw", "says"), [({"q_len": 65}, "q_len must be in 1..64"), ({"H": 0}, "H must be")])
def test_a_shape_no_table_can_hold_is_named_when_the_client_is_made(tmp_path, kw, says):
    with pytest.raises(ValueError, match=says):
        ConfigClient(**({"H": 8, "q_len": 9} | kw), device="NVIDIA H200", snapshot_dir=tmp_path)


def test_a_worker_names_its_kv_format_which_is_checked_and_left_out_of_its_request_at_bf16(tmp_path, monkeypatch):
    """A format the kernel does not read is the worker's mistake, said at construction; at bf16 the
    request carries no kv_dtype, so a sidecar older than the parameter (which refuses parameters it
    does not know) still answers the worker."""
    import dataclasses

    from verify_tuner.kernels import formats

    listed = dataclasses.replace(formats.FORMATS["fp8_e4m3"], name="fp8_e5m2", kernel_reads=False)
    monkeypatch.setitem(formats.FORMATS, "fp8_e5m2", listed)  # listed ahead of its kernel code
    with pytest.raises(ValueError, match="kv_dtype fp8_e5m2 .*not read by this kernel version yet"):
        ConfigClient(None, H=8, q_len=9, device="h200", kv_dtype="fp8_e5m2", snapshot_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown kv_dtype 'fp16': accepted: bf16, fp8_e4m3"):
        ConfigClient(None, H=8, q_len=9, device="h200", kv_dtype="fp16", snapshot_dir=tmp_path)
    c = ConfigClient("http://127.0.0.1:1", H=8, q_len=9, device="h200", snapshot_dir=tmp_path, timeout_s=0.2)
    asked = []

    def get_table(base_url, query, etag, timeout_s):  # type: ignore[no-untyped-def]
        asked.append(query)
        raise OSError("no sidecar here")

    c._requests.get_table = get_table  # type: ignore[method-assign]
    assert c.fetch() == "heuristic" and c.key.kv_dtype == "bf16"
    assert asked == [{"H": 8, "q_len": 9, "device": "h200", "all_batches": "true"} | {"kernel_hash": c.kernel_hash}]
    e4m3 = ConfigClient("http://127.0.0.1:1", H=8, q_len=9, device="h200", kv_dtype="fp8_e4m3", snapshot_dir=tmp_path,
                        timeout_s=0.2)  # fmt: skip
    e4m3._requests.get_table = get_table  # type: ignore[method-assign]
    assert e4m3.fetch() == "heuristic" and asked[-1]["kv_dtype"] == "fp8_e4m3"


def test_a_table_made_before_a_key_field_existed_is_read_at_that_fields_default(tmp_path):
    """A key dimension added later (docs/architecture.md) must not turn every table an older
    sidecar serves, or an older snapshot holds, into one for another key."""
    from tests.test_key_derived import WithPageSize

    c = ConfigClient(None, H=8, q_len=9, device="h200", snapshot_dir=tmp_path)
    older = c.key.values()  # what a sidecar or snapshot from before `page` holds
    c.key = WithPageSize(**older)  # a worker whose key has `page`, at its default
    c._check_key(older)
    c._check_key(older | {"page": 1})
    with pytest.raises(ValueError, match="table is for page 16, this worker's is 1"):
        c._check_key(older | {"page": 16})
    c.key = WithPageSize(**older, page=16)  # a worker on pages of 16: an older table is not its
    with pytest.raises(ValueError, match="table is for page 1, this worker's is 16"):
        c._check_key(older)
