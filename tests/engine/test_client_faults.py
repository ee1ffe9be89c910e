"""The worker client against sidecars and tables that are broken in the ways a host meets them: an
answer cut short, another service on the port, a hand-edited or truncated table. fetch() passes
each such source over and says why; it never raises."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from verify_tuner import batches, buckets, engine_files
from verify_tuner.engine.client import URL_ENV, ConfigClient
from verify_tuner.engine.config_table import heuristic_table
from verify_tuner.kernels import KERNEL_NAME, KERNEL_VERSION, kernel_hash
from verify_tuner.kernels.limits import known_device

H200 = known_device("h200")


@pytest.fixture(autouse=True)
def _no_sidecar_from_the_environment(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(URL_ENV, raising=False)


def sidecar_table() -> dict:
    """A valid /configs answer (every batch bucket, the heuristic's entries) for H=8 q_len=9."""
    configs = [
        {"bucket": {"lo": e.lo, "hi": e.hi}, "batch_bucket": {"index": i}, **e.config.as_params(), "source": e.source}
        for i, es in heuristic_table(H200, H=8, q_len=9).items()
        for e in es
    ]
    return {
        "device": H200.name,
        "kernel_hash": kernel_hash(),
        "dtype": "bf16",
        "H": 8,
        "q_len": 9,
        "configs": configs,
        "graph_plans": [],
    }


def engine_doc() -> dict:
    """The same table as a `tuner configs dump` file."""
    configs = {
        str(batches.by_index(i).hi): [
            {"prefix_lo": e.lo, "prefix_hi": e.hi, **e.config.as_params(), "source": e.source} for e in es
        ]
        for i, es in heuristic_table(H200, H=8, q_len=9).items()
    }
    return {
        "format": engine_files.FORMAT,
        "kernel": KERNEL_NAME,
        "kernel_version": KERNEL_VERSION,
        "kernel_hash": kernel_hash(),
        "device_name": H200.name,
        "dtype": "bf16",
        "H": 8,
        "q_len": 9,
        "configs": configs,
        "graph_plans": {},
    }


def write_engine_file(folder, doc: dict):  # type: ignore[no-untyped-def]
    path = folder / engine_files.file_name(H=8, q_len=9, device=H200.name, dtype="bf16")
    engine_files.write_atomic(path, doc)
    return path


def http_answer(body: bytes, *, length: int | None = None) -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length or len(body)}\r\n\r\n"
    return head.encode() + body


@contextlib.contextmanager
def raw_sidecar(send: Callable[[socket.socket], None]) -> Iterator[str]:
    """A TCP server on localhost that reads a request and then calls `send` with the connection."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conns.append(conn)
            with conn:
                conn.recv(65536)
                with contextlib.suppress(OSError):  # the client may hang up first
                    send(conn)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        for conn in conns:  # ends a trickle still sending
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        thread.join(5)
        assert not thread.is_alive()
        server.close()


def client(url: str | None, tmp_path, **kw) -> ConfigClient:  # type: ignore[no-untyped-def]
    return ConfigClient(url, H=8, q_len=9, device="NVIDIA H200", snapshot_dir=tmp_path / "snap", timeout_s=1.0, **kw)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (http_answer(b'{"kernel_hash": "', length=40_000), "IncompleteRead"),  # the sidecar died mid-answer
        (b"SSH-2.0-OpenSSH_9.2\r\n", "BadStatusLine: SSH-2.0-OpenSSH_9.2"),  # another service on the port
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", "LineTooLong"),
    ],
    ids=["cut-short", "not-http", "header-too-long"],
)
def test_an_answer_that_is_not_whole_http_is_passed_over(tmp_path, raw, why):
    with raw_sidecar(lambda conn: conn.sendall(raw)) as url:
        c = client(url, tmp_path)
        assert c.fetch() == "heuristic"
        assert f"sidecar unavailable at {url} (no valid HTTP answer: {why}" in c.reason
        assert "\n" not in c.reason and c.lookup(46000, 8) is not None
        assert c.refresh() == "failed" and "no valid HTTP answer" in c.refresh_error  # type: ignore[operator]


BAD_ENTRIES = [
    pytest.param({"NSPLIT": 0}, "NSPLIT must be a positive integer, got 0", id="nsplit-0"),
    pytest.param({"NSPLIT": None}, "constants must be integers", id="nsplit-null"),
    pytest.param(
        {"source": ["tuned"]},
        "prefix bounds must be integers and source a name, got 512..724 ['tuned']",
        id="source-a-list",
    ),
]


@pytest.mark.parametrize(("edit", "why"), BAD_ENTRIES)
def test_a_malformed_entry_from_the_sidecar_is_passed_over(tmp_path, edit, why):
    table = sidecar_table()
    table["configs"][3].update(edit)
    body = json.dumps(table).encode()
    with raw_sidecar(lambda conn: conn.sendall(http_answer(body))) as url:
        c = client(url, tmp_path)
        assert c.fetch() == "heuristic"
    assert f"served a table this worker cannot use (ValueError: malformed table: {why}" in c.reason


@pytest.mark.parametrize(("edit", "why"), BAD_ENTRIES)
def test_a_malformed_entry_in_the_config_dir_or_the_snapshot_is_passed_over(tmp_path, edit, why):
    doc = engine_doc()
    doc["configs"]["1"][3].update(edit)
    write_engine_file(tmp_path / "cfg", doc)
    c = client(None, tmp_path, config_dir=tmp_path / "cfg")
    good = sidecar_table()
    c.snapshot.parent.mkdir(parents=True)
    c.snapshot.write_text(json.dumps(good))
    assert c.fetch() == "snapshot"
    assert f"config dir {tmp_path / 'cfg'}: ValueError: malformed table: {why}" in c.reason
    good["configs"][3].update(edit)
    c.snapshot.write_text(json.dumps(good))
    assert c.fetch() == "heuristic"
    assert f"no usable snapshot (ValueError: malformed table: {why}" in c.reason


def test_malformed_graph_plans_are_passed_over(tmp_path):
    doc = engine_doc()
    doc["graph_plans"] = []  # the sidecar's shape in a file, which keys its plans by batch bucket
    write_engine_file(tmp_path / "cfg", doc)
    table = sidecar_table()
    table["graph_plans"] = [{"NSPLIT": 8, "batch_bucket": {"index": 3}}]
    body = json.dumps(table).encode()
    with raw_sidecar(lambda conn: conn.sendall(http_answer(body))) as url:
        c = client(url, tmp_path, config_dir=tmp_path / "cfg")
        assert c.fetch() == "heuristic"
    assert "(ValueError: malformed table: no field 'buckets')" in c.reason
    assert "ValueError: malformed table: graph_plans must be an object, not list" in c.reason


def trickle(raw: bytes, every_s: float = 0.15) -> Callable[[socket.socket], None]:
    """Send `raw` a byte at a time: each read is well inside the client's timeout, the whole is not."""

    def send(conn: socket.socket) -> None:
        for b in raw:
            conn.sendall(bytes([b]))
            time.sleep(every_s)

    return send


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",  # slow to even say it failed
        http_answer(json.dumps(sidecar_table()).encode()),  # a good table, sent too slowly to wait for
    ],
    ids=["status-line", "body"],
)
def test_a_sidecar_trickling_its_answer_does_not_hold_fetch_past_timeout_s(tmp_path, raw):
    with raw_sidecar(trickle(raw)) as url:
        c = client(url, tmp_path)
        c.snapshot.parent.mkdir(parents=True)
        c.snapshot.write_text(json.dumps(sidecar_table()))
        started = time.monotonic()
        assert c.fetch() == "snapshot"
        assert time.monotonic() - started < c.timeout_s + 0.5
        assert "sidecar unavailable" in c.reason and "TimeoutError: no whole answer within timeout_s=1 s" in c.reason
        started = time.monotonic()  # the first answer is still coming: no second thread is started for it
        assert c.refresh() == "failed" and time.monotonic() - started < 0.5
        assert "answer to an earlier request is still coming" in c.refresh_error  # type: ignore[operator]
        assert c.source == "snapshot" and c.lookup(46000, 8) is not None


def test_a_table_that_stops_short_of_the_longest_prefix_is_refused_at_fetch(tmp_path):
    """A trimmed or older file without the open last bucket: refused up front, not in lookup()."""
    doc = engine_doc()
    doc["configs"] = {hi: es[:-1] for hi, es in doc["configs"].items()}
    write_engine_file(tmp_path / "cfg", doc)
    c = client(None, tmp_path, config_dir=tmp_path / "cfg")
    short = sidecar_table()
    short["configs"] = [e for e in short["configs"] if e["bucket"]["hi"] <= buckets.MAX_EDGE]
    c.snapshot.parent.mkdir(parents=True)
    c.snapshot.write_text(json.dumps(short))
    assert c.fetch() == "heuristic"
    why = f"table covers prefixes up to {buckets.MAX_EDGE - 1}, not {buckets.MAX_PREFIX}"
    assert f"config dir {tmp_path / 'cfg'}: ValueError: {why}" in c.reason
    assert f"no usable snapshot (ValueError: {why})" in c.reason
    assert c.lookup(buckets.MAX_PREFIX, 8) == c.graph_plan(8, max_prefix=buckets.MAX_PREFIX).config
