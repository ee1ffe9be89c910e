"""Issue 30 item 10: `tuner serve` refuses, in one line and before binding, a port outside
1..65535 (the health port's too) and a write token no client could send."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers import tuner_cmd


def _serve(tmp_path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'c.db'}"
    good = {**os.environ, "TUNER_DATABASE_URL": url, "TUNER_HOST": "127.0.0.1"}
    subprocess.run(tuner_cmd("db", "upgrade"), env=good, check=True, capture_output=True, timeout=60)
    full = {**good, **env}
    # a server that does start is the failure: the timeout ends it and the test fails on it
    return subprocess.run(tuner_cmd("serve", *args), env=full, capture_output=True, text=True, timeout=20, check=False)


@pytest.mark.parametrize(
    "env, args, says",
    [
        ({"TUNER_PORT": "99999"}, (), "1..65535, got 99999"),
        ({"TUNER_PORT": "0"}, (), "1..65535, got 0"),
        ({"TUNER_PORT": "80_80"}, (), "port number 1..65535, got '80_80'"),
        ({}, ("--port", "-1"), "1..65535, got -1"),
        (
            {"TUNER_PORT": "8177", "TUNER_HEALTH_PORT": "8177"},
            (),
            "TUNER_HEALTH_PORT must be 1..65535 and not the main",
        ),
        ({"TUNER_HEALTH_PORT": "70000"}, (), "TUNER_HEALTH_PORT must be 1..65535"),
        ({"TUNER_HEALTH_PORT": "81x"}, (), "TUNER_HEALTH_PORT must be an integer port number"),
        ({"TUNER_PORT": "8177", "TUNER_WRITE_TOKEN": "a-long-enough-token-01\n"}, (), "trailing newline"),
        ({"TUNER_PORT": "8177", "TUNER_WRITE_TOKEN": "a-long-enough-tökén-01"}, (), "printable ASCII"),
    ],
)
def test_serve_refuses_a_bad_port_or_token_in_one_line(tmp_path, env, args, says):
    out = _serve(tmp_path, env, *args)
    assert out.returncode != 0 and says in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
