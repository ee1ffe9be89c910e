"""Engine-style config files (`tuner configs dump`) and the worker client reading them with no
server dependencies installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import tuner_cmd

ROWS = [
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
        "median_us": 50.0,
        "p10_us": 49.0,
        "p90_us": 52.0,
        "default_us": 56.0,
        "tuned_at": "2026-11-29T10:00:00+00:00",
    },
    {
        "device": "h200",
        "H": 8,
        "q_len": 9,
        "prefix": 46000,
        "batch_bucket": 5,
        "NSPLIT": 8,
        "HT": 8,
        "TK": 32,
        "BLOCK": 256,
        "STAGES": 2,
        "QT": 0,
        "WR": 2,
        "WK": 4,
        "SF": 0,
        "PIPE": 1,
        "median_us": 1100.0,
        "tuned_at": "2026-11-29T11:00:00+00:00",
    },
    {
        "device": "h200",
        "H": 64,
        "q_len": 1,
        "prefix": 131072,
        "NSPLIT": 16,
        "HT": 8,
        "TK": 32,
        "BLOCK": 256,
        "QT": 0,
        "WK": 4,
        "SF": 0,
        "PIPE": 1,
        "STAGES": 2,
        "WR": 1,
        "median_us": 70.0,
    },
]
BLOCKED = (
    "fastapi",
    "uvicorn",
    "starlette",
    "sqlalchemy",
    "alembic",
    "optuna",
    "torch",
    "pycuda",
    "pydantic",
    "click",
    "prometheus_client",
)


def _tuner(env, *args):  # type: ignore[no-untyped-def]
    return subprocess.run(
        tuner_cmd(*args), env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False
    )


def _dumped(tmp_path: Path) -> tuple[dict[str, str], Path]:
    env = {"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}"}
    assert _tuner(env, "db", "upgrade").returncode == 0
    (tmp_path / "rows.json").write_text(json.dumps(ROWS))
    r = _tuner(env, "configs", "import", str(tmp_path / "rows.json"))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "engine"
    r = _tuner(env, "configs", "dump", "--out-dir", str(out), "--shape", "16:9")
    assert r.returncode == 0, r.stderr
    return env, out


def test_dump_writes_one_engine_file_per_shape_and_imports_back_the_same_rows(tmp_path):
    env, out = _dumped(tmp_path)
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "H=16,q_len=9,device_name=NVIDIA_H200,dtype=bf16.json",
        "H=64,q_len=1,device_name=NVIDIA_H200,dtype=bf16.json",
        "H=8,q_len=9,device_name=NVIDIA_H200,dtype=bf16.json",
    ]
    doc = json.loads((out / names[2]).read_text(), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert doc["kernel_hash"] and doc["kernel_version"] and doc["device_name"] == "NVIDIA H200"
    assert set(doc["configs"]) == {"1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1024", "2048", "4096"}
    tuned = [e for es in doc["configs"].values() for e in es if e["source"] == "tuned"]
    assert sorted(e["NSPLIT"] for e in tuned) == [8, 64] and {e["median_us"] for e in tuned} == {50.0, 1100.0}
    h16 = json.loads((out / names[0]).read_text())
    assert {e["source"] for es in h16["configs"].values() for e in es} == {"heuristic"}
    # round trip: the dump imported into an empty database restores the same rows
    before = json.loads(_tuner(env, "configs", "export").stdout)
    env2 = {"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.db'}"}
    assert _tuner(env2, "db", "upgrade").returncode == 0
    for p in sorted(out.iterdir()):
        r = _tuner(env2, "configs", "import", str(p))
        assert r.returncode == 0, r.stderr
    after = json.loads(_tuner(env2, "configs", "export").stdout)
    assert after == before


def test_a_worker_with_only_the_config_dir_and_no_server_packages_gets_the_tuned_config(tmp_path):
    """The issue's acceptance: VERIFY_TUNER_CONFIG_DIR set, no sidecar, and every server
    dependency made unimportable in the worker's interpreter."""
    _, out = _dumped(tmp_path)
    worker = f"""
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"blocked: {{name}}", name=name)
sys.meta_path.insert(0, Block())
from verify_tuner.engine.client import ConfigClient
c = ConfigClient(H=8, q_len=9, device="NVIDIA H200 NVL", snapshot_dir=sys.argv[1])
src = c.fetch()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r})
print(json.dumps({{"source": src, "reason": c.reason, "b1": c.lookup(46000).nsplit,
                  "b32": c.lookup(46000, batch=20).nsplit, "heavy": heavy}}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIFY_TUNER")}
    env.update({"VERIFY_TUNER_CONFIG_DIR": str(out), "PYTHONPATH": os.getcwd()})
    r = subprocess.run(
        [sys.executable, "-c", worker, str(tmp_path / "snap")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["source"] == "config_dir" and "no sidecar" in res["reason"], res
    assert (res["b1"], res["b32"], res["heavy"]) == (64, 8, [])


def test_sources_in_order_and_a_table_for_another_kernel_is_refused(tmp_path, monkeypatch):
    from verify_tuner.engine.client import ConfigClient

    _, out = _dumped(tmp_path)
    monkeypatch.setenv("VERIFY_TUNER_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("VERIFY_TUNER_CONFIG_DIR", str(out))
    c = ConfigClient(H=8, q_len=9, device="NVIDIA_H200", snapshot_dir=tmp_path / "s", timeout_s=0.2)
    assert c.fetch() == "config_dir" and "sidecar unavailable" in c.reason and c.lookup(46000).nsplit == 64
    other = ConfigClient(
        H=8, q_len=9, device="NVIDIA H200", snapshot_dir=tmp_path / "s", timeout_s=0.2, kernel_hash="0" * 16
    )
    assert other.fetch() == "heuristic"
    assert "table is for kernel_hash '" in other.reason and "this worker's is '0000000000000000'" in other.reason
    lost = ConfigClient(
        H=8, q_len=9, device="NVIDIA H200", config_dir=tmp_path / "missing", snapshot_dir=tmp_path / "s", timeout_s=0.2
    )
    assert lost.fetch() == "heuristic" and "FileNotFoundError" in lost.reason


def test_dump_with_a_bad_shape_is_one_line(tmp_path):
    env = {"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}"}
    assert _tuner(env, "db", "upgrade").returncode == 0
    r = _tuner(env, "configs", "dump", "--out-dir", str(tmp_path / "o"), "--shape", "8x9")
    assert r.returncode == 2 and "--shape" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_dump_with_cubins_writes_the_bundle_an_inference_host_loads(tmp_path):
    """Every config the dumped tables serve, compiled for the device's arch, in OUT_DIR/cubins."""
    from verify_tuner import engine_files
    from verify_tuner.engine.bundle import Bundle

    env = {"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}", "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    assert _tuner(env, "db", "upgrade").returncode == 0
    (tmp_path / "rows.json").write_text(json.dumps(ROWS[2:]))  # one table: H=64 q_len=1
    assert _tuner(env, "configs", "import", str(tmp_path / "rows.json")).returncode == 0
    out = tmp_path / "engine"
    r = _tuner(env, "configs", "dump", "--out-dir", str(out), "--cubins")
    assert r.returncode == 0, r.stderr
    (table,) = out.glob("H=64*.json")
    configs = engine_files.distinct_configs(json.loads(table.read_text()))
    assert len(configs) >= 2  # the tuned row and the heuristic the other buckets answer with
    bundle = Bundle.open(out / "cubins")
    for cfg in configs:
        assert bundle.cubin(cfg, 1, "sm_90")[:4] == b"\x7fELF"
    assert str(out / "cubins" / "manifest.json") in r.stdout
