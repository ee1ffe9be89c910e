"""docker-compose.yml, checked by reading it and by running its services' commands as processes
(there is no Docker engine here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from tests.helpers import free_port, running_server

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_structure():
    s = COMPOSE["services"]
    assert s["migrate"]["command"] == ["tuner", "db", "upgrade"]
    assert s["configs"]["command"] == ["tuner", "serve"]
    assert s["configs"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "/readyz" in " ".join(s["configs"]["healthcheck"]["test"])
    for name in ("migrate", "configs", "tuner"):
        assert "configs-data:/data" in s[name]["volumes"]
    assert "configs-data" in COMPOSE["volumes"]
    assert s["tuner"]["profiles"] == ["tune"] and s["tuner"]["command"][:3] == ["tuner", "study", "start"]
    gpu = s["tuner"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert "profiles" not in s["configs"]  # the sidecar runs by default, the tuner only on request


def test_dockerfile_runs_as_non_root_without_cuda():
    text = (ROOT / "Dockerfile").read_text()
    assert "USER tuner" in text and "cuda" not in text.split("pip install", 1)[1].split("\n", 1)[0]


def test_services_commands_run_as_processes(tmp_path):
    env = {k: v for k, v in COMPOSE["x-env"].items()}
    env["TUNER_DATABASE_URL"] = env["TUNER_DATABASE_URL"].replace("/data", str(tmp_path))
    env["TUNER_DEVICE"] = "h200"
    full = {**os.environ, **env}
    migrate = COMPOSE["services"]["migrate"]["command"]
    subprocess.run([sys.executable, "-m", "tuner", *migrate[1:]], env=full, check=True, capture_output=True,
                   timeout=60)
    port = free_port()
    with running_server(env, port=port):
        r = httpx.get(f"http://127.0.0.1:{port}/readyz")
        assert r.status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/config", params={"H": 8, "q_len": 9, "prefix": 46000}).json()[
            "source"] == "heuristic"
