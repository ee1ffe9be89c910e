"""Issue 30 item 4: a kubelet's probe on a new connection is answered within 250 ms while the
main port is saturated. TUNER_HEALTH_PORT serves /healthz and /readyz from its own thread
(api/health_server.py), with the main port's readiness semantics (api/readiness.py)."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port, running_server, tuner_cmd

ROOT = Path(__file__).resolve().parents[2]
LOAD = """
import asyncio, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("load_test", sys.argv[1])
lt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lt)
print(json.dumps(asyncio.run(lt.run(sys.argv[2], clients=200, requests=10**6, rate=0.0, max_s=float(sys.argv[3])))))
"""


def _serve_env(tmp_path: Path) -> dict[str, str]:
    env = {"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}", "TUNER_DEVICE": "h200"}
    subprocess.run(tuner_cmd("db", "upgrade"), env={**os.environ, **env}, check=True, capture_output=True, timeout=60)
    return env | {"TUNER_HEALTH_PORT": str(free_port())}


def _probe(port: int, path: str) -> tuple[float, bytes]:
    """As a kubelet probes: a new connection, `Connection: close`, a 1 s timeout; the first bytes timed."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            first = s.recv(64)
    except OSError as exc:
        first = type(exc).__name__.encode()
    return time.perf_counter() - t0, first


def test_probes_on_the_health_port_are_answered_while_the_main_port_is_saturated(tmp_path):
    env = _serve_env(tmp_path)
    port, health_port = free_port(), int(env["TUNER_HEALTH_PORT"])
    with running_server(env, port=port) as server:
        load = subprocess.Popen(
            [sys.executable, "-c", LOAD, str(ROOT / "bench" / "load_test.py"), f"http://127.0.0.1:{port}", "8"],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(2.0)  # the 200 connections open and the loop is saturated
        ours, main = [], []
        while load.poll() is None and len(ours) < 40:
            for path in ("/healthz", "/readyz"):
                ours.append(_probe(health_port, path))
            main.append(_probe(port, "/healthz"))
            time.sleep(0.05)
        res = json.loads(load.communicate(timeout=60)[0])
    # The main port's own answers are test_load's subject; here the load only has to saturate it.
    # A client stops at its first error, so `errors` counts clients lost. CI's shared 2-core VM has
    # lost 22 of the 200 at the opening burst, each a first request unanswered in 5 s: the signature
    # of a listen-queue overflow (`bench/load_test.py --listen-backlog 8` reproduces it;
    # not reproduced here with 64). The load still saturates the port if nine in ten clients stay.
    assert res["sent"] > 1000 and res["errors"] <= 200 // 10, (
        res["errors"],
        res["error_kinds"],
        res["first_errors"],
    )
    assert len(ours) >= 20, "the load ended before the probes ran"
    ms = sorted(t * 1e3 for t, _ in ours)
    assert all(first.startswith(b"HTTP/1.1 200") for _, first in ours), [f for _, f in ours]
    main_ms = statistics.median(t * 1e3 for t, _ in main)
    # the kubelet's timeout is the limit never to pass; the 250 ms is the typical answer
    assert ms[-1] < 1000 and statistics.median(ms) < 250, (ms, f"main port p50 {main_ms:.0f} ms")
    assert "Traceback" not in server.stdout.read()  # a probe that reads its status line and leaves is no error


def test_the_health_port_answers_readiness_as_the_main_port_does_and_nothing_else(tmp_path):
    env = _serve_env(tmp_path)
    port, health_port = free_port(), int(env["TUNER_HEALTH_PORT"])
    main, health = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{health_port}"
    with running_server(env, port=port):
        assert httpx.get(f"{health}/healthz").json() == {"status": "ok"}
        ready = httpx.get(f"{health}/readyz")
        assert ready is not None and ready.status_code == 200 and ready.json() == httpx.get(f"{main}/readyz").json()
        assert ready.headers["connection"] == "close"
        assert httpx.get(f"{health}/config", params={"H": 8, "q_len": 9, "prefix": 1}).status_code == 404
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(tmp_path / f"c.db{suffix}"):
                os.remove(tmp_path / f"c.db{suffix}")
        for base in (health, main):
            gone = httpx.get(f"{base}/readyz")
            assert gone.status_code == 503 and "missing" in gone.json()["reason"], (base, gone.text)
        assert httpx.get(f"{health}/healthz").status_code == 200  # alive: only not ready
        metrics = httpx.get(f"{main}/metrics").text
        assert 'route="/readyz (health port)",status="503"' in metrics


def test_a_health_port_in_use_stops_the_start_naming_it(tmp_path):
    env = _serve_env(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", int(env["TUNER_HEALTH_PORT"])))
        taken.listen()
        out = subprocess.run(
            tuner_cmd("serve"),
            env={**os.environ, **env, "TUNER_HOST": "127.0.0.1", "TUNER_PORT": str(free_port())},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert out.returncode != 0 and f"TUNER_HEALTH_PORT {env['TUNER_HEALTH_PORT']}" in out.stderr, out.stderr
    # one line, not uvicorn's lifespan traceback
    assert "Traceback" not in out.stderr + out.stdout and len(out.stderr.strip().splitlines()) == 1, out.stderr


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_the_health_port_listens_on_an_ipv6_host(tmp_path):
    env = _serve_env(tmp_path)
    health = f"http://[::1]:{env['TUNER_HEALTH_PORT']}"
    full = {**os.environ, **env, "TUNER_HOST": "::", "TUNER_PORT": str(free_port())}
    proc = subprocess.Popen(tuner_cmd("serve"), env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, ready = time.monotonic() + 30, None
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                ready = httpx.get(f"{health}/readyz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert proc.poll() is None, proc.stdout.read()  # socketserver's IPv4-only default refused '::'
        assert ready is not None and ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
        assert httpx.get(f"{health}/healthz", timeout=1).json() == {"status": "ok"}
    finally:
        proc.terminate()
        proc.wait(10)


def _raw(port: int, request: str) -> bytes:
    """Everything the server sends for one request on a new connection that it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as s:
        s.sendall(request.encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_head_is_answered_as_get_without_a_body_on_both_ports(tmp_path):
    """A load balancer's HEAD probe met a 405 on the main port and a 501 on the health port."""
    env = _serve_env(tmp_path)
    port, health_port = free_port(), int(env["TUNER_HEALTH_PORT"])
    paths = ["/healthz", "/readyz", "/metrics", "/config?H=8&q_len=9&prefix=46000", "/configs?H=8&q_len=9"]
    with running_server(env, port=port):
        for path in paths:
            get, head = httpx.get(f"http://127.0.0.1:{port}{path}"), httpx.head(f"http://127.0.0.1:{port}{path}")
            assert head.status_code == get.status_code == 200, (path, head.status_code)
            assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"], path
            # and on the wire: the status line and headers, then nothing (the connection stays framed)
            wire = _raw(port, f"HEAD {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert wire.startswith(b"HTTP/1.1 200") and wire.endswith(b"\r\n\r\n"), (path, wire[-80:])
        wire = _raw(health_port, "HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert wire.startswith(b"HTTP/1.1 200") and wire.endswith(b"\r\n\r\n"), wire
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert 'tuner_requests_total{method="HEAD",route="/config",status="200"} 2.0' in metrics  # counted as HEADs


@pytest.mark.parametrize("which", ["main", "health", "host"])
def test_a_port_in_use_or_a_bad_host_is_one_line_and_exit_1(tmp_path, which):
    """uvicorn answered a main port in use with its own log lines and exit 3."""
    env = _serve_env(tmp_path)
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1] if which == "main" else free_port()
    if which == "health":
        env["TUNER_HEALTH_PORT"] = str(taken.getsockname()[1])
    host = "999.1.1.1" if which == "host" else "127.0.0.1"
    full = {**os.environ, **env, "TUNER_HOST": host, "TUNER_PORT": str(port)}
    with taken:
        r = subprocess.run(tuner_cmd("serve"), env=full, capture_output=True, text=True, timeout=60, check=False)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("Error: cannot listen on "), r.stderr
    assert ("TUNER_HEALTH_PORT" in lines[0]) == (which == "health"), lines[0]


def test_405_and_options_name_every_method_a_path_answers(tmp_path):
    """`DELETE /healthz` said `allow: GET` (HEAD is answered too) and `POST /configs` said GET though
    DELETE works; OPTIONS was a 405. An operator's `curl -X OPTIONS` or a proxy's check reads Allow."""
    env = _serve_env(tmp_path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running_server(env, port=port):
        cases = {
            ("DELETE", "/healthz"): "GET, HEAD, OPTIONS",
            ("POST", "/configs"): "GET, HEAD, DELETE, OPTIONS",
            ("GET", "/configs/import"): "POST, OPTIONS",
        }
        for (method, path), allow in cases.items():
            r = httpx.request(method, base + path)
            assert r.status_code == 405 and r.headers["allow"] == allow, (method, path, r.headers)
            assert r.json() == {"detail": "Method Not Allowed"}
            o = httpx.request("OPTIONS", base + path)
            assert o.status_code == 204 and o.headers["allow"] == allow and o.content == b"", (path, o.headers)
            assert "content-length" not in o.headers  # RFC 9110 8.6: none on a 204
        assert httpx.request("OPTIONS", base + "/nope").status_code == 404
        # a 204 is framed without a body: the next request on the same connection is answered
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(
                b"OPTIONS /config HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            wire = b""
            while chunk := s.recv(65536):
                wire += chunk
        assert wire.startswith(b"HTTP/1.1 204") and wire.count(b"HTTP/1.1 ") == 2 and wire.endswith(b'{"status":"ok"}')
        metrics = httpx.get(f"{base}/metrics").text
    assert 'tuner_requests_total{method="OPTIONS",route="/config",status="204"} 1.0' in metrics, metrics


def test_clients_trickling_their_headers_do_not_hold_the_health_port(tmp_path):
    """2 s was each read's timeout, not the request's: eight connections sending a header line every
    0.5 s held every slot, and the kubelet's probes were closed unanswered until they stopped."""
    env = _serve_env(tmp_path)
    port, health_port = free_port(), int(env["TUNER_HEALTH_PORT"])
    with running_server(env, port=port):
        slow = [socket.create_connection(("127.0.0.1", health_port), timeout=5) for _ in range(8)]
        try:
            for s in slow:
                s.sendall(b"GET /healthz HTTP/1.1\r\n")
            cut, t0, answered = set(), time.monotonic(), []
            while time.monotonic() - t0 < 6.0:
                for i, s in enumerate(slow):
                    if i not in cut:
                        try:
                            s.sendall(b"X-Slow: 1\r\n")
                        except OSError:
                            cut.add(i)
                if time.monotonic() - t0 > 3.0:  # past the 2 s deadline: the slots are free again
                    answered.append(_probe(health_port, "/healthz")[1])
                time.sleep(0.5)
        finally:
            for s in slow:
                s.close()
    assert answered and all(a.startswith(b"HTTP/1.1 200") for a in answered), answered
    assert len(cut) == 8  # each trickler was cut at its deadline
