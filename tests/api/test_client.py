"""The worker client: sidecar, then snapshot, then heuristic; lookups with no I/O."""

from __future__ import annotations

import json

from api.client import ConfigClient
from kernels.limits import known_device
from kernels.validate import check
from tests.helpers import free_port, running_server


def test_fetch_from_sidecar_then_snapshot_then_heuristic(tmp_path):
    import subprocess
    import sys

    db = f"sqlite:///{tmp_path / 'c.db'}"
    env = {"TUNER_DATABASE_URL": db, "TUNER_DEVICE": "h200"}
    import os

    full = {**os.environ, **env}
    subprocess.run([sys.executable, "-m", "tuner", "db", "upgrade"], env=full, check=True, capture_output=True)
    rows = [{"device": "h200", "H": 8, "q_len": 9, "prefix": 46000, "NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256}]
    (tmp_path / "r.json").write_text(json.dumps(rows))
    subprocess.run([sys.executable, "-m", "tuner", "configs", "import", str(tmp_path / "r.json")], env=full,
                   check=True, capture_output=True)
    port = free_port()
    snap = tmp_path / "snap"
    with running_server(env, port=port):
        c = ConfigClient(f"http://127.0.0.1:{port}", H=8, q_len=9, device="NVIDIA H200", snapshot_dir=snap)
        assert c.fetch() == "sidecar"
        assert c.lookup(46000).nsplit == 64 and c.lookup(60000).nsplit == 64  # tuned + nearest (one octave)
        assert c.snapshot.exists()
    # sidecar gone: the snapshot answers the same
    c2 = ConfigClient(f"http://127.0.0.1:{port}", H=8, q_len=9, device="NVIDIA H200", snapshot_dir=snap,
                      timeout_s=0.5)
    assert c2.fetch() == "snapshot" and "sidecar unavailable" in c2.reason
    assert c2.lookup(46000) == c.lookup(46000)
    # no snapshot either: the heuristic, valid for the device
    c3 = ConfigClient(f"http://127.0.0.1:{port}", H=8, q_len=9, device="h200", snapshot_dir=tmp_path / "none",
                      timeout_s=0.5)
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
