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
    health_port = s["configs"]["environment"]["TUNER_HEALTH_PORT"]  # probed apart from the saturable main port
    assert f"127.0.0.1:{health_port}/readyz" in " ".join(s["configs"]["healthcheck"]["test"])
    for name in ("migrate", "configs", "tuner"):
        assert "configs-data:/data" in s[name]["volumes"]
    assert "configs-data" in COMPOSE["volumes"]
    assert s["tuner"]["profiles"] == ["tune"] and s["tuner"]["command"][:3] == ["tuner", "study", "start"]
    gpu = s["tuner"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert "profiles" not in s["configs"]  # the sidecar runs by default, the tuner only on request


def test_the_device_is_required_not_empty():
    """An empty default started a sidecar that answered every device-less request (the README's curl)
    with a 422: compose now refuses to start without it, saying what to set."""
    value = COMPOSE["x-env"]["TUNER_DEVICE"]
    assert value.startswith("${TUNER_DEVICE:?") and "TUNER_DEVICE=h200" in value, value


def test_dockerfile_runs_as_non_root_without_cuda():
    text = (ROOT / "Dockerfile").read_text()
    assert "USER 10001" in text and "cuda" not in text.split("pip install", 1)[1].split("\n", 1)[0]


def test_services_commands_run_as_processes(tmp_path):
    env = {k: v for k, v in COMPOSE["x-env"].items()}
    env["TUNER_DATABASE_URL"] = env["TUNER_DATABASE_URL"].replace("/data", str(tmp_path))
    env["TUNER_DEVICE"] = "h200"
    full = {**os.environ, **env}
    migrate = COMPOSE["services"]["migrate"]["command"]
    subprocess.run([sys.executable, "-m", "tuner", *migrate[1:]], env=full, check=True, capture_output=True, timeout=60)
    port = free_port()
    with running_server(env, port=port):
        r = httpx.get(f"http://127.0.0.1:{port}/readyz")
        assert r.status_code == 200
        assert (
            httpx.get(f"http://127.0.0.1:{port}/config", params={"H": 8, "q_len": 9, "prefix": 46000}).json()["source"]
            == "heuristic"
        )


def test_dockerfile_gives_the_runtime_user_its_data_directory():
    text = (ROOT / "Dockerfile").read_text()
    before_volume = text.split('VOLUME ["/data"]', 1)[0]
    assert "mkdir -p /data && chown 10001:10001 /data" in before_volume  # a fresh named volume inherits it
    assert "USER 10001:10001" in text  # numeric: Kubernetes' runAsNonRoot can verify it
    health = next(ln for ln in text.splitlines() if ln.strip().startswith('CMD ["python"'))
    assert health.strip().startswith('CMD ["python", "-c"')  # exec form: no shell needed in the image
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "*.db", "tests"} <= set(ignore)


def test_db_upgrade_as_the_images_user_on_a_root_owned_volume_is_one_line_naming_the_fix(tmp_path):
    """What `docker compose up` did on a fresh machine before /data was created in the image: the
    non-root user met a root-owned volume and got SQLite's raw 'unable to open database file'."""
    import shutil
    import tempfile

    data = Path(tempfile.mkdtemp(prefix="root-owned-volume-"))
    try:
        data.chmod(0o755)
        env = {**os.environ, "TUNER_DATABASE_URL": f"sqlite:///{data}/configs.db"}
        cmd = [sys.executable, "-m", "tuner", "db", "upgrade"]
        if os.getuid() == 0:  # as root, drop to the image's uid as `USER 10001:10001` does
            if shutil.which("setpriv") is None:
                import pytest

                pytest.skip("running as root without setpriv: cannot run as the image's user")
            cmd = ["setpriv", "--reuid=10001", "--regid=10001", "--clear-groups", *cmd]
        else:  # not root: a directory this user cannot write stands for the root-owned volume
            data.chmod(0o555)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert "is not writable by uid" in r.stderr and "chown" in r.stderr and "TUNER_DATABASE_URL" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        if os.getuid() == 0:  # the image's fix: /data owned by the runtime user
            os.chown(data, 10001, 10001)
            ok = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
            assert ok.returncode == 0, ok.stderr
            assert (data / "configs.db").stat().st_uid == 10001
    finally:
        data.chmod(0o755)
        shutil.rmtree(data, ignore_errors=True)
