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
from verify_tuner.engine import sidecar
from verify_tuner.engine.client import URL_ENV, ConfigClient
from verify_tuner.engine.config_table import heuristic_table
from verify_tuner.kernels import KERNEL_NAME, KERNEL_VERSION, kernel_hash
from verify_tuner.kernels.limits import known_device
from verify_tuner.keys import TableKey

H200 = known_device("h200")
TABLE = TableKey(H200.name, kernel_hash(), "bf16", 8, 9)


@pytest.fixture(autouse=True)
def _no_sidecar_from_the_environment(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(URL_ENV, raising=False)


def sidecar_table() -> dict:
    """A valid /configs answer (every batch bucket, the heuristic's entries) for H=8 q_len=9."""
    configs = [
        {"bucket": {"lo": e.lo, "hi": e.hi}, "batch_bucket": {"index": i}, **e.config.as_params(), "source": e.source}
        for i, es in heuristic_table(H200, TABLE).items()
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
        for i, es in heuristic_table(H200, TABLE).items()
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
    path = folder / engine_files.file_name(TABLE)
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
    kw = {"snapshot_dir": tmp_path / "snap", "timeout_s": 1.0} | kw
    return ConfigClient(url, H=8, q_len=9, device="NVIDIA H200", **kw)


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
    pytest.param({"NSPLIT": True}, "constants must be integers: True is not an integer", id="nsplit-true"),
    pytest.param({"NSPLIT": 132.9}, "constants must be integers: 'float' object", id="nsplit-float"),
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


@pytest.mark.parametrize("value", [None, {"name": "NVIDIA H200"}, 200])
@pytest.mark.parametrize("source", ["sidecar", "config_dir", "snapshot"])
def test_a_table_whose_device_is_not_a_name_is_passed_over(tmp_path, source, value):
    """fetch() raised AttributeError from same_device() on a null or object device field."""
    table, doc = sidecar_table(), engine_doc()
    table["device"], doc["device_name"] = value, value
    kw = {}
    if source == "config_dir":
        write_engine_file(tmp_path / "cfg", doc)
        kw["config_dir"] = tmp_path / "cfg"
    with raw_sidecar(lambda conn: conn.sendall(http_answer(json.dumps(table).encode()))) as url:
        c = client(url if source == "sidecar" else None, tmp_path, **kw)
        if source == "snapshot":
            c.snapshot.parent.mkdir(parents=True)
            c.snapshot.write_text(json.dumps(table))
        assert c.fetch() == "heuristic"
        assert "TypeError: table's device must be a name" in c.reason
        if source == "sidecar":
            assert c.refresh() == "failed" and "must be a name" in c.refresh_error  # type: ignore[operator]


def test_a_sidecar_streaming_an_endless_body_is_passed_over_without_filling_memory(tmp_path):
    """Another service (or a proxy) on the sidecar's port answering 200 and sending on: the worker
    reads at most MAX_TABLE_BYTES of it, not the whole stream."""

    def endless(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
        chunk = b" " * (1 << 20)
        for _ in range(4 * (sidecar.MAX_TABLE_BYTES >> 20)):  # bounded: the test server stops by itself
            conn.sendall(chunk)

    with raw_sidecar(endless) as url:
        c = client(url, tmp_path, timeout_s=10.0)
        assert c.fetch() == "heuristic"
        assert f"answer longer than {sidecar.MAX_TABLE_BYTES >> 20} MB: not a config table" in c.reason


def test_the_request_thread_ends_soon_after_its_deadline_so_a_later_refresh_asks_again(tmp_path):
    """A sidecar trickling an answer forever: the thread that waited for it stops reading once its
    deadline passed, so refresh() asks anew rather than reporting the old answer as still coming."""
    body = json.dumps(sidecar_table()).encode() * 50
    with raw_sidecar(trickle(http_answer(body), every_s=0.01)) as url:
        c = client(url, tmp_path, timeout_s=0.5)
        assert c.fetch() == "heuristic"
        time.sleep(0.5)
        assert c.refresh() == "failed"
        assert "no whole answer within timeout_s=0.5 s" in c.refresh_error  # type: ignore[operator]


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


def plan() -> dict:
    """A valid graph plan as the sidecar serves it, for batch bucket 0."""
    cfg = heuristic_table(H200, TABLE)[0][0].config
    return {
        **cfg.as_params(),
        "batch_bucket": {"index": 0},
        "prefix_lo": 1024,
        "prefix_hi": 131072,
        "expected_us": 40.0,
        "buckets": [{"prefix_lo": 1024, "prefix_hi": 2048, "regret": 1.2}],
        "measured_at": "2026-12-03",
        "measured_by": "a test",
    }


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (
            {"prefix_lo": 131072, "prefix_hi": 1024},
            "graph plan prefixes must be integers 0 <= lo < hi, got 131072..1024",
        ),
        ({"expected_us": "fast"}, "expected_us must be a positive finite number, got 'fast'"),
        ({"buckets": [{"prefix_lo": 1024, "prefix_hi": 2048, "regret": "NaN"}]}, "regret must be a positive finite"),
        (
            {"buckets": [{"prefix_lo": 1024, "prefix_hi": 2048, "regret": float("inf")}]},
            "regret must be a positive finite number, got inf",
        ),
    ],
    ids=["range-upside-down", "time-a-string", "regret-a-string", "regret-infinite"],
)
def test_a_graph_plan_with_values_an_engine_cannot_use_is_passed_over(tmp_path, edit, why):
    """graph_plan() hands these to the engine at capture time: a string time or an upside-down
    range reached it as such."""
    table = sidecar_table()
    table["graph_plans"] = [plan()]
    good = json.dumps(table).encode()
    with raw_sidecar(lambda conn: conn.sendall(http_answer(good))) as url:
        c = client(url, tmp_path)
        assert c.fetch() == "sidecar", c.reason
        choice = c.graph_plan(1, max_prefix=100_000)
        assert choice.source == "graph_plan" and choice.expected_us == 40.0 and choice.regrets == ((1024, 2048, 1.2),)
    table["graph_plans"] = [plan() | edit]
    bad = json.dumps(table).encode()  # json writes inf as Infinity, which Python's json reads back
    with raw_sidecar(lambda conn: conn.sendall(http_answer(bad))) as url:
        c = client(url, tmp_path, snapshot_dir=tmp_path / "other")
        assert c.fetch() == "heuristic"
    assert f"served a table this worker cannot use (ValueError: malformed table: {why}" in c.reason


def test_json_nested_too_deep_is_passed_over_from_every_source(tmp_path):
    deep = b"[" * 100_000 + b"]" * 100_000
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / engine_files.file_name(TABLE)).write_bytes(deep)
    with raw_sidecar(lambda conn: conn.sendall(http_answer(deep))) as url:
        c = client(url, tmp_path, config_dir=tmp_path / "cfg")
        c.snapshot.parent.mkdir(parents=True)
        c.snapshot.write_bytes(deep)
        assert c.fetch() == "heuristic"
    assert c.reason.count("RecursionError") == 3, c.reason


def test_refresh_from_several_threads_at_once_never_raises_nor_says_a_healthy_sidecar_failed(tmp_path):
    body = json.dumps(sidecar_table()).encode()
    with raw_sidecar(lambda conn: conn.sendall(http_answer(body))) as url:
        c = client(url, tmp_path, timeout_s=5.0)
        assert c.fetch() == "sidecar"
        results: list[str] = []
        errors: list[BaseException] = []

        def refresh_often() -> None:
            try:
                results.extend(c.refresh() for _ in range(40))
            except BaseException as exc:  # noqa: BLE001 -- what the test is about
                errors.append(exc)

        threads = [threading.Thread(target=refresh_often) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert set(results) == {"updated"} and len(results) == 160, (set(results), c.refresh_error)


def test_numpy_integers_index_the_client_as_ints(tmp_path):
    np = pytest.importorskip("numpy")
    c = ConfigClient(None, H=np.int64(8), q_len=np.int32(9), device="NVIDIA H200", snapshot_dir=tmp_path)
    assert c.fetch() == "heuristic" and type(c.H) is int
    assert c.lookup(np.int64(46000), batch=np.int64(8)) == c.lookup(46000, 8)
    assert c.graph_plan(np.int64(8), max_prefix=np.int64(131071)).config == c.lookup(131071, 8)
    with pytest.raises(TypeError):
        c.lookup(46000, batch=8.0)  # a float batch is the caller's bug, said at once
    with pytest.raises(ValueError, match="H must be an integer, got 8.0"):
        ConfigClient(None, H=8.0, q_len=9, device="NVIDIA H200")


def test_a_user_with_no_home_gets_a_table_and_no_snapshot(tmp_path, monkeypatch):
    """A container run as an arbitrary uid has no passwd entry and no HOME: the snapshot is
    optional, so the client goes on without it and says so."""
    import verify_tuner.engine.client as client_module

    def no_home(*_a, **_k):  # what platformdirs raises there
        raise RuntimeError("could not determine the home directory")

    monkeypatch.setattr(client_module, "user_cache_dir", no_home)
    body = json.dumps(sidecar_table()).encode()
    with raw_sidecar(lambda conn: conn.sendall(http_answer(body))) as url:
        c = ConfigClient(url, H=8, q_len=9, device="NVIDIA H200", timeout_s=1.0)
        assert c.snapshot is None
        assert c.fetch() == "sidecar"
    assert "snapshot not saved (OSError: no snapshot folder (RuntimeError: could not determine" in c.reason
    c2 = ConfigClient(None, H=8, q_len=9, device="NVIDIA H200")
    assert c2.fetch() == "heuristic" and "no snapshot folder (RuntimeError" in c2.reason


def fake_bundle(root, configs) -> None:  # type: ignore[no-untyped-def]
    """A bundle manifest holding `configs` at q_len 9 on the H200 (the client reads only the manifest)."""
    from verify_tuner.engine.bundle import MANIFEST

    root.mkdir()
    entries = [
        {"arch": H200.arch, "kv_dtype": "bf16", "q_len": 9, "config": c.as_params()}
        | {"file": f"{i}.cubin", "sha256": "0" * 64}
        for i, c in enumerate(sorted(configs))
    ]
    (root / MANIFEST).write_text(json.dumps({"kernel_hash": kernel_hash(), "entries": entries}))


def test_a_table_serving_a_config_the_cubin_bundle_lacks_is_passed_over(tmp_path, monkeypatch):
    """A row tuned after the bundle was built: capturing it on a host without nvcc raised BundleError."""
    heuristic = {e.config for es in heuristic_table(H200, TABLE).values() for e in es}
    fake_bundle(tmp_path / "cubins", heuristic)
    monkeypatch.setenv("VERIFY_TUNER_CUBINS", str(tmp_path / "cubins"))
    table = sidecar_table()
    table["configs"][3]["NSPLIT"] = 64  # tuned after the bundle
    body = json.dumps(table).encode()
    write_engine_file(tmp_path / "cfg", engine_doc())  # the files the bundle was dumped with
    with raw_sidecar(lambda conn: conn.sendall(http_answer(body))) as url:
        c = client(url, tmp_path, config_dir=tmp_path / "cfg")
        assert c.fetch() == "config_dir", c.reason
    assert "1 of its" in c.reason and f"configs are not in the cubin bundle at {tmp_path / 'cubins'}" in c.reason
    assert "NSPLIT=64" in c.reason and "tuner configs dump --cubins" in c.reason
    # the heuristic is what is left, and a bundle without it is said, not hidden
    fake_bundle(tmp_path / "other", set())
    c = client(None, tmp_path, cubins=tmp_path / "other")
    assert c.fetch() == "heuristic" and "warning: the heuristic's" in c.reason and "not in the cubin bundle" in c.reason


def _error_answer(status: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        ("422 Unprocessable Entity", b'{"detail": ["bad"]}', "HTTP 422: bad)"),  # a gateway's own list
        ("422 Unprocessable Entity", b'{"detail": [{"msg": "no loc"}, 7]}', "HTTP 422: {'msg': 'no loc'}; 7)"),
        ("422 Unprocessable Entity", b'{"detail": [{"loc": ["query", "H"], "msg": "bad H"}]}', "query.H: bad H"),
        ("502 Bad Gateway", b'{"detail": {"upstream": "down"}}', "HTTP 502: {'upstream': 'down'})"),
        ("502 Bad Gateway", b"[" * 2000 + b"]" * 2000, "HTTP 502: [[[["),  # nested past the parser's depth
    ],
    ids=["list-of-strings", "list-of-odd-items", "fastapi-422", "dict-detail", "too-deep"],
)
def test_an_error_answer_of_any_shape_is_passed_over_with_its_status(tmp_path, status, body, says):
    """A proxy's 422 with `{"detail": ["bad"]}` raised AttributeError out of fetch() and refresh()."""
    with raw_sidecar(lambda conn: conn.sendall(_error_answer(status, body))) as url:
        c = client(url, tmp_path)
        assert c.fetch() == "heuristic" and says in c.reason, c.reason
        assert c.refresh() == "failed" and says in c.refresh_error, c.refresh_error  # type: ignore[operator]


def test_a_cubin_manifest_nested_past_the_parsers_depth_is_a_warning_not_a_raise(tmp_path):
    (tmp_path / "cubins").mkdir()
    (tmp_path / "cubins" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    c = client(None, tmp_path, cubins=tmp_path / "cubins")
    assert c.fetch() == "heuristic"
    assert "unreadable cubin bundle manifest" in c.reason and "RecursionError" in c.reason, c.reason


def test_a_sidecar_on_this_host_is_asked_directly_whatever_the_proxy_environment(tmp_path, monkeypatch):
    """A GPU node's HTTP_PROXY sent the loopback request to the proxy: the worker fell back to the
    heuristic, blaming a sidecar that was up."""
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    body = json.dumps(sidecar_table()).encode()
    with raw_sidecar(lambda conn: conn.sendall(http_answer(body))) as url:
        for base in (url, url.replace("127.0.0.1", "localhost")):
            c = client(base, tmp_path)
            assert c.fetch() == "sidecar", c.reason


def test_a_remote_sidecar_goes_through_the_proxy_and_the_reason_names_it(tmp_path, monkeypatch):
    for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)

    def proxy_answers_502(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 11\r\n\r\nbad gateway")

    with raw_sidecar(proxy_answers_502) as proxy:
        monkeypatch.setenv("http_proxy", proxy.replace("http://", "http://user:secret@"))
        remote = "http://10.255.255.1:8177"  # never reached: the proxy answers for it
        c = client(remote, tmp_path)
        assert c.fetch() == "heuristic"
        assert f"sidecar unavailable at {remote} (through the proxy {proxy}) (HTTP 502" in c.reason, c.reason
        assert "secret" not in c.reason
        monkeypatch.setenv("no_proxy", "10.255.255.1")  # the operator's bypass is honoured
        assert sidecar.proxy_for(remote) is None


def _two_ranges(**second: object) -> list[dict]:
    """A plan set of two ranges split at 4096, as GET /configs lists them; `second` edits the second."""
    shared = {"range_count": 2, "breakpoints": [4096], "weights_digest": "d" * 64, "set_prefix_lo": 0}
    short = plan() | shared | {"range_index": 0, "prefix_lo": 0, "prefix_hi": 4096, "NSPLIT": 64}
    long = plan() | shared | {"range_index": 1, "prefix_lo": 4096}
    return [short, long | second]


@pytest.mark.parametrize(
    "second",
    [
        {"measured_at": "2026-12-04"},  # another measurement: a range of another set
        {"weights_digest": "e" * 64},
        {"prefix_lo": 8192},  # a gap
        {"range_index": 0},
        {"breakpoints": [8192]},
        {"range_count": 3},
    ],
    ids=["measured-apart", "other-weights", "gap", "index", "breakpoints", "count"],
)
def test_graph_plan_ranges_of_two_sets_are_passed_over(tmp_path, second):
    """A worker must never capture one set's range beside another's: the table is refused whole."""
    table = sidecar_table()
    table["graph_plans"] = _two_ranges()
    good = json.dumps(table).encode()
    with raw_sidecar(lambda conn: conn.sendall(http_answer(good))) as url:
        c = client(url, tmp_path)
        assert c.fetch() == "sidecar", c.reason
        short, long = c.graph_plans(1, max_prefix=131071)
    assert (short.config.nsplit, short.prefix_range, long.prefix_range) == (64, (0, 4096), (4096, 131072))
    table["graph_plans"] = _two_ranges(**second)
    bad = json.dumps(table).encode()
    with raw_sidecar(lambda conn: conn.sendall(http_answer(bad))) as url:
        c = client(url, tmp_path, snapshot_dir=tmp_path / "other")
        assert c.fetch() == "heuristic"
    assert "malformed table: the graph plans of batch bucket 0 are not the ranges of one set" in c.reason


def test_a_file_s_malformed_graph_plan_ranges_are_passed_over(tmp_path):
    for ranges in ([], {"1": {"NSPLIT": 8}}):
        doc = engine_doc() | {"graph_plan_ranges": ranges}
        write_engine_file(tmp_path / "cfg", doc)
        c = client(None, tmp_path, config_dir=tmp_path / "cfg")
        assert c.fetch() == "heuristic"
        assert "malformed table: graph_plan_ranges must be an object of lists" in c.reason
