"""Issue 30 item 10: `tuner serve` refuses, in one line and before binding, a port outside
1..65535 (the health port's too), a write token no client could send, and a default device
(TUNER_DEVICE / --device) that requests could not resolve."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time

import httpx
import pytest

from tests.helpers import eventually, free_port, running_server, tuner_cmd


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
        ({"TUNER_PORT": "8177", "TUNER_WRITE_TOKEN": "password12345678"}, (), "guessable"),  # it started
        ({"TUNER_PORT": "8177", "TUNER_WRITE_TOKEN": "aaaaaaaaaaaa1234abcd"}, (), "guessable"),
        ({"TUNER_DEVICE": "h2OO"}, (), "TUNER_DEVICE/--device 'h2OO' is neither a known GPU"),
        ({"TUNER_DEVICE": "h200"}, ("--device", "h2OO"), "TUNER_DEVICE/--device 'h2OO' is neither a known GPU"),
    ],
)
def test_serve_refuses_a_bad_port_token_or_device_in_one_line(tmp_path, env, args, says):
    out = _serve(tmp_path, env, *args)
    assert out.returncode != 0 and says in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_malformed_url_never_shows_its_password(tmp_path):
    """A port that is not a number printed the whole URL, password included (others were masked)."""
    url = "postgresql+psycopg://tuner:hunter2-secret@db.internal:54x32/configs"
    for how in ({"TUNER_DATABASE_URL": url}, None):
        env = {**os.environ, **(how or {})}
        args = ("serve",) if how else ("--database-url", url, "serve")
        out = subprocess.run(tuner_cmd(*args), env=env, capture_output=True, text=True, timeout=20, check=False)
        assert out.returncode != 0 and "not a database URL" in out.stderr, out.stderr
        assert "hunter2" not in out.stderr and "tuner:***@db.internal" in out.stderr, out.stderr


def _answers_without_a_device(env: dict[str, str], device: str) -> None:
    port = free_port()
    with running_server(env, port=port):
        r = httpx.get(f"http://127.0.0.1:{port}/config", params={"H": 8, "q_len": 9, "prefix": 1000})
        assert r.status_code == 200 and r.json()["device"] == device, r.text


def test_serve_with_a_known_gpu_as_default_device_on_a_fresh_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    subprocess.run(tuner_cmd("--database-url", url, "db", "upgrade"), check=True, capture_output=True, timeout=60)
    _answers_without_a_device({"TUNER_DATABASE_URL": url, "TUNER_DEVICE": "h200"}, "NVIDIA H200")


def test_serve_with_a_device_recorded_only_in_the_database_as_default(tmp_path):
    from verify_tuner.kernels.limits import KNOWN_DEVICES
    from verify_tuner.store import devices
    from verify_tuner.store.session import make_engine, session_factory, session_scope

    url = f"sqlite:///{tmp_path / 'c.db'}"
    subprocess.run(tuner_cmd("--database-url", url, "db", "upgrade"), check=True, capture_output=True, timeout=60)
    # as `tuner device record` stores a GPU the table of known ones lacks
    lab_gpu = dataclasses.replace(KNOWN_DEVICES["NVIDIA H200"], name="Lab GPU 7")
    engine = make_engine(url)
    with session_scope(session_factory(engine)) as s:
        devices.upsert_device(session=s, limits=lab_gpu)
    engine.dispose()
    _answers_without_a_device({"TUNER_DATABASE_URL": url, "TUNER_DEVICE": "Lab GPU 7"}, "Lab GPU 7")


def test_the_only_recorded_device_stays_the_default_when_a_second_is_imported_while_serving(tmp_path):
    """With TUNER_DEVICE unset (compose's default), a device-less request was answered for the only
    recorded device, decided per request: importing a second device's rows while serving turned
    every such request into a 422, and /readyz stayed ready."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    env = {"TUNER_DATABASE_URL": url}
    row = {
        "device": "h200",
        "H": 8,
        "q_len": 9,
        "prefix": 46000,
        "NSPLIT": 66,
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
    other = {**row, "device": "a100", "NSPLIT": 54, "TK": 16, "STAGES": 3, "WK": 4}
    for name, r in (("h200.json", row), ("a100.json", other)):
        (tmp_path / name).write_text(json.dumps([{**r, "median_us": 40.0, "default_us": 42.0}]))
    subprocess.run(tuner_cmd("--database-url", url, "db", "upgrade"), check=True, capture_output=True, timeout=60)
    subprocess.run(
        tuner_cmd("--database-url", url, "configs", "import", str(tmp_path / "h200.json")),
        check=True,
        capture_output=True,
        timeout=60,
    )
    port = free_port()
    with running_server(env, port=port):
        params = {"H": 8, "q_len": 9, "prefix": 46000}
        before = httpx.get(f"http://127.0.0.1:{port}/config", params=params)
        assert before.status_code == 200 and before.json()["device"] == "NVIDIA H200", before.text
        subprocess.run(
            tuner_cmd("--database-url", url, "configs", "import", str(tmp_path / "a100.json")),
            check=True,
            capture_output=True,
            timeout=60,
        )
        a100 = {**params, "device": "a100"}  # seen once its row is served: then the default is tested
        eventually(
            lambda: httpx.get(f"http://127.0.0.1:{port}/config", params=a100).json()["source"] == "tuned",
            "the second device's import never seen",
            within_s=20,
        )
        after = httpx.get(f"http://127.0.0.1:{port}/config", params=params)
        assert after.status_code == 200 and after.json()["device"] == "NVIDIA H200", after.text
        assert after.json()["source"] == "tuned"


def test_a_sidecar_started_on_an_empty_database_keeps_the_first_device_it_answered_for(tmp_path):
    """Started before any tuning (compose brings the sidecar up first), with TUNER_DEVICE unset:
    device-less requests were 422s until a device was recorded, then answered for it, then 422s
    again once a second device was imported."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    row = {
        "device": "h200",
        "H": 8,
        "q_len": 9,
        "prefix": 46000,
        "NSPLIT": 66,
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
    other = {**row, "device": "a100", "NSPLIT": 54, "TK": 16, "STAGES": 3, "WK": 4}
    for name, r in (("h200.json", row), ("a100.json", other)):
        (tmp_path / name).write_text(json.dumps([{**r, "median_us": 40.0, "default_us": 42.0}]))
    subprocess.run(tuner_cmd("--database-url", url, "db", "upgrade"), check=True, capture_output=True, timeout=60)
    port = free_port()
    base, params = f"http://127.0.0.1:{port}", {"H": 8, "q_len": 9, "prefix": 46000}

    def imported(name: str, seen: dict[str, object]) -> httpx.Response:
        """Import a file, then wait (a busy VM: up to 20 s) until the sidecar answers `seen` tuned."""
        subprocess.run(
            tuner_cmd("--database-url", url, "configs", "import", str(tmp_path / name)),
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 20
        while True:
            r = httpx.get(f"{base}/config", params={**params, **seen})
            if (r.status_code == 200 and r.json()["source"] == "tuned") or time.monotonic() > deadline:
                return r
            time.sleep(0.1)

    with running_server({"TUNER_DATABASE_URL": url}, port=port) as server:
        empty = httpx.get(f"{base}/config", params=params)
        assert empty.status_code == 422 and "none recorded" in empty.text, empty.text
        first = imported("h200.json", {})  # device-less: answered for the only device, which pins it
        assert first.status_code == 200 and first.json()["device"] == "NVIDIA H200", first.text
        seen = imported("a100.json", {"device": "a100"})
        assert seen.json()["device"] == "NVIDIA A100-SXM4-80GB" and seen.json()["source"] == "tuned", seen.text
        for route, query in (("/config", params), ("/configs", {"H": 8, "q_len": 9})):
            after = httpx.get(f"{base}{route}", params=query)
            assert after.status_code == 200 and after.json()["device"] == "NVIDIA H200", (route, after.text)
        server.terminate()
        out = server.communicate(timeout=10)[0]
    assert out.count("default device: NVIDIA H200, the only one recorded when first asked") == 1, out


def test_the_health_port_may_be_the_default_main_port_once_serve_port_moves_it(tmp_path):
    """TUNER_HEALTH_PORT=8177 with `serve --port 8190` was refused as "not the main port": the
    environment was checked before --port applied."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    subprocess.run(tuner_cmd("--database-url", url, "db", "upgrade"), check=True, capture_output=True, timeout=60)
    health, port = free_port(), free_port()
    env = {**os.environ, "TUNER_DATABASE_URL": url, "TUNER_HOST": "127.0.0.1", "TUNER_PORT": str(health)}
    env["TUNER_HEALTH_PORT"] = str(health)  # equal to TUNER_PORT, which --port then replaces
    proc = subprocess.Popen(tuner_cmd("serve", "--port", str(port)), env=env, stderr=subprocess.PIPE, text=True)
    try:
        ok = eventually(
            lambda: proc.poll() is not None or _get(f"http://127.0.0.1:{health}/healthz") == 200, "no health port", 30
        )
        assert ok and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert _get(f"http://127.0.0.1:{port}/healthz") == 200
    finally:
        proc.terminate()
        proc.wait(10)


def _get(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=1).status_code
    except httpx.HTTPError:
        return None


def test_connections_accepted_on_the_bound_socket_send_without_nagle(tmp_path):
    """`tuner serve` binds its socket itself; asyncio sets TCP_NODELAY only on connections accepted
    from a socket whose protocol says TCP, and without it a response's second write waited for the
    client's delayed ACK: p99 45 ms at 2 req/s a client, 5 ms with it (bench/load_test.py)."""
    import asyncio
    import socket

    from verify_tuner.api import server
    from verify_tuner.settings import Settings

    with socket.socket() as free:  # a free port (Settings refuses 0)
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    sock = server.bind(Settings(database_url=f"sqlite:///{tmp_path}/c.db", host="127.0.0.1", port=port))
    nodelay: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport):  # type: ignore[no-untyped-def]
            conn = transport.get_extra_info("socket")
            nodelay.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def main() -> None:
        srv = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(100):
            if nodelay:
                break
            await asyncio.sleep(0.01)
        writer.close()
        srv.close()

    asyncio.run(main())  # asyncio's own loop: tuner serve's (uvloop sets it whatever the socket)
    assert nodelay and nodelay[0] != 0
