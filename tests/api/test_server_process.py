"""The sidecar as it ships: `tuner db upgrade` then `tuner serve`, a real uvicorn process."""

from __future__ import annotations

import json
import subprocess

import httpx

from tests.helpers import free_port, running_server, tuner_cmd


def test_upgrade_serve_import_and_lookup(tmp_path):
    env = {
        "TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}",
        "TUNER_DEVICE": "h200",
        "TUNER_CACHE_DIR": str(tmp_path / "cache"),
    }
    import os

    full = {**os.environ, **env}
    out = subprocess.run(
        tuner_cmd("serve"),
        env={**full, "TUNER_PORT": str(free_port())},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0 and "tuner db upgrade" in out.stderr  # refuses an empty database
    subprocess.run(tuner_cmd("db", "upgrade"), env=full, check=True, capture_output=True, timeout=60)
    port = free_port()
    with running_server(env, port=port):
        base = f"http://127.0.0.1:{port}"
        r = httpx.get(f"{base}/config", params={"H": 8, "q_len": 9, "prefix": 46000})
        assert r.status_code == 200 and r.json()["source"] == "heuristic"
        row = [
            {
                "device": "NVIDIA H200",
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
                "median_us": 40.0,
            }
        ]
        (tmp_path / "rows.json").write_text(json.dumps(row))
        subprocess.run(
            tuner_cmd("configs", "import", str(tmp_path / "rows.json")),
            env=full,
            check=True,
            capture_output=True,
            timeout=60,
        )
        assert httpx.get(f"{base}/config", params={"H": 8, "q_len": 9, "prefix": 46000}).json()["source"] == "tuned"
        assert httpx.get(f"{base}/config", params={"H": 8, "q_len": 9, "prefix": 60000}).json()["source"] == "nearest"
        assert httpx.get(f"{base}/config", params={"H": 0, "q_len": 9, "prefix": 1}).status_code == 422
        assert httpx.get(f"{base}/readyz").status_code == 200
