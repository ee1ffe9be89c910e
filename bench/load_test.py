"""Load test of a real `tuner serve` over loopback: N concurrent clients, bounded in count and
time. Writes load_test.{md,json} into --out.

    python bench/load_test.py --clients 200 --requests 100000 --max-seconds 10 --rate 0 2 --repeat 2
Each client keeps one connection and sends --requests lookups (or until --max-seconds), paced at
--rate per second (0 = back to back: flat out, which measures capacity and saturation latency).
Each row also records how many lookups the server answered from the database path
(`tuner_db_path_lookups_total` in /metrics, before and after): none while the data is unchanged.
Meanwhile a separate process probes /healthz and /readyz on new connections, on the main port and
on the health port (TUNER_HEALTH_PORT), as a kubelet does.

    python bench/load_test.py --clients 200 --requests 100000 --max-seconds 10 --rate 0 --repeat 2 \
        --listen-backlog 8 --tag stall
caps the server's listen queue, as a kernel with a tiny net.core.somaxconn would: what a
listen-queue overflow looks like to the load.

During each flat-out run, another process opens --burst new connections at once (default 100), a
third of the way in, and times each one's first byte of a GET /config: what a worker fleet
starting, or reconnecting, meets while the sidecar is saturated. --loop picks the main port's
event loop (default: the one `tuner serve` uses) to compare uvloop and asyncio's own. Give --out
a folder outside the repository unless the run is meant to be committed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers import free_port, running_server


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, path: str) -> int:
    """One keep-alive HTTP/1.1 GET; returns the status. A minimal client keeps the load
    generator's own CPU cost low on a 2-core machine it shares with the server."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionResetError("server closed the idle keep-alive connection")
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return int(status_line.split()[1])


TARGETS = {
    "config": "GET /config (random prefix)",
    "configs_all": "GET /configs?all_batches=true (every batch bucket's table, ~113 KB: a worker's startup fetch)",
}


def _path(target: str, rng: random.Random) -> str:
    if target == "configs_all":
        return "/configs?H=8&q_len=9&all_batches=true"
    return f"/config?H=8&q_len=9&prefix={rng.randrange(0, 200_000)}"


async def client(
    base: str,
    n: int,
    rate: float,
    deadline: float,
    lat: list[float],
    errors: list[str],
    rng: random.Random,
    target: str = "config",
    events: list[dict] | None = None,
    t_start: float = 0.0,
) -> None:
    """`events` gets each error's kind, the request's index on its connection (0: its first) and
    when (s into the run) the connection opened and the request was sent."""
    host, port = base.removeprefix("http://").split(":")
    await asyncio.sleep(rng.random() / rate if rate > 0 else 0)  # spread the first requests
    reader, writer = await asyncio.open_connection(host, int(port))
    connected = time.perf_counter() - t_start
    try:
        for i in range(n):
            if time.monotonic() > deadline:
                return
            path = _path(target, rng)
            t0 = time.perf_counter()
            try:
                try:
                    status = await asyncio.wait_for(_get(reader, writer, host, path), 5.0)
                except ConnectionResetError:  # idle connection closed by the server: reconnect once
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, int(port))
                    status = await asyncio.wait_for(_get(reader, writer, host, path), 5.0)
                if status != 200:
                    errors.append(f"HTTP {status}")
            except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
                errors.append(type(exc).__name__)
                if events is not None:
                    at = {"connected_s": round(connected, 3), "sent_s": round(t0 - t_start, 3)}
                    events.append({"kind": type(exc).__name__, "request": i} | at)
                return
            finally:
                lat.append(time.perf_counter() - t0)
            if rate > 0:  # Poisson arrivals at `rate` per second
                await asyncio.sleep(max(0.0, rng.expovariate(rate) - (time.perf_counter() - t0)))
    finally:
        writer.close()


def probe(bases: list[str], seconds: float, every_s: float = 0.25) -> list[dict]:
    """A health probe as a kubelet sends it: a new connection per request, `Connection: close`,
    a 1 s timeout; run in its own process so the load generator's event loop does not delay it.
    Each round probes /healthz then /readyz on each base (the main port, then the health port)."""
    import socket

    out, stop = [], time.monotonic() + seconds
    while time.monotonic() < stop:
        for port_name, base in zip(("main", "health"), bases, strict=False):
            host, port = base.removeprefix("http://").split(":")
            for path in ("/healthz", "/readyz"):
                t0 = time.perf_counter()
                try:
                    with socket.create_connection((host, int(port)), timeout=1.0) as s:
                        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
                        first = s.recv(64)
                        ok = first.startswith(b"HTTP/1.1 200")
                except OSError as exc:
                    ok, first = False, type(exc).__name__.encode()
                out.append({"port": port_name, "path": path, "ms": (time.perf_counter() - t0) * 1e3, "ok": ok})
        time.sleep(every_s)
    return out


async def _burst(base: str, n: int, timeout_s: float = 10.0) -> list[float | None]:
    """Seconds to the first byte of a GET /config on each of `n` new connections opened at once
    (None: refused, reset or over `timeout_s`)."""
    host, port = base.removeprefix("http://").split(":")

    async def one(i: int) -> float | None:
        t0, writer = time.perf_counter(), None
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(f"GET /config?H=8&q_len=9&prefix={i * 997} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                await writer.drain()
                if not await reader.read(1):
                    return None
            return time.perf_counter() - t0
        except (OSError, TimeoutError):
            return None
        finally:
            if writer is not None:
                writer.close()

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def burst(base: str, n: int, after_s: float) -> list[float | None]:
    """The burst process's work: wait `after_s` (the load saturating the server), then `_burst`."""
    time.sleep(after_s)
    return asyncio.run(_burst(base, n))


def _burst_during(base: str, n: int, after_s: float) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--burst-of", str(n), base, "--max-seconds", str(after_s)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def burst_summary(firsts: list[float | None]) -> dict:
    """The burst's first-byte times: how many, how many never answered, p50, max, and over 1 s."""
    ms = sorted(x * 1e3 for x in firsts if x is not None)
    return {
        "burst": len(firsts),
        "burst_failed": len(firsts) - len(ms),
        "burst_p50_ms": statistics.median(ms) if ms else None,
        "burst_max_ms": ms[-1] if ms else None,
        "burst_over_1s": sum(m > 1000 for m in ms) + len(firsts) - len(ms),
    }


def _probe_during(bases: list[str], seconds: float) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--probe", *bases, "--max-seconds", str(seconds)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def _probe_summary(proc: subprocess.Popen) -> dict:
    """The main port's probes as before (probes, probe_*), the health port's as health_port_*."""
    samples = json.loads(proc.communicate(timeout=120)[0])
    out: dict = {}
    for port_name, prefix in (("main", "probe"), ("health", "health_port_probe")):
        mine = [x for x in samples if x["port"] == port_name]
        if not mine:
            continue
        ms = sorted(x["ms"] for x in mine)
        out |= {
            f"{prefix}s": len(mine),
            f"{prefix}_failed": sum(not x["ok"] for x in mine),
            f"{prefix}_p50_ms": statistics.median(ms),
            f"{prefix}_max_ms": ms[-1],
            f"{prefix}_over_250ms": sum(m > 250 for m in ms),
            **{
                f"{prefix}_{path}_p50_max_ms": _p50_max([x["ms"] for x in mine if x["path"] == f"/{path}"])
                for path in ("healthz", "readyz")
            },
        }
    return out


def _p50_max(ms: list[float]) -> list[float]:
    return [round(statistics.median(ms), 1), round(max(ms), 1)] if ms else []


MINIMAL_APP = """
body = b'{"NSPLIT":64,"HT":8,"TK":32,"BLOCK":256}'
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
"""


#: `tuner serve`'s app and uvicorn config with the listen backlog (argv[1], 0: as is) and the event loop
#: (argv[2], "default": as is) changed; the wrapped command's own argv follows, unused.
SERVE_CHANGED = """
import sys, uvicorn
from verify_tuner.api import server
from verify_tuner.api.app import create_app
from verify_tuner.settings import Settings
settings = Settings.from_env()
config = server.uvicorn_config(create_app(settings), settings)
if int(sys.argv[1]):
    config.backlog = int(sys.argv[1])
if sys.argv[2] != "default":
    config.loop = sys.argv[2]
uvicorn.Server(config).run()
"""


def _minimal_uvicorn(tmp: Path, port: int) -> subprocess.Popen:
    """uvicorn's defaults serving one fixed body: the ceiling this machine sets on any uvicorn app."""
    (tmp / "minimal_app.py").write_text(MINIMAL_APP)
    cmd = [sys.executable, "-m", "uvicorn", "minimal_app:app", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.DEVNULL)
    import urllib.request

    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).read()
            return proc
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the minimal uvicorn app did not come up")


def _db_path_lookups(base: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()
    return float(next(ln for ln in text.splitlines() if ln.startswith("tuner_db_path_lookups_total")).split()[-1])


async def run(
    base: str, clients: int, requests: int, rate: float, max_s: float, target: str = "config", minimal: bool = False
) -> dict:
    lat: list[float] = []
    errors: list[str] = []
    events: list[dict] = []
    db_before = 0.0 if minimal else _db_path_lookups(base)
    deadline = time.monotonic() + max_s
    t0 = time.perf_counter()
    await asyncio.gather(
        *(
            client(base, requests, rate, deadline, lat, errors, random.Random(i), target, events, t0)
            for i in range(clients)
        )
    )
    wall = time.perf_counter() - t0
    q = statistics.quantiles(lat, n=100)
    return {
        "clients": clients,
        "requests_per_client": requests,
        "rate_per_client": rate,
        "sent": len(lat),
        "errors": len(errors),
        "error_kinds": sorted(set(errors)),
        "first_errors": sorted(events, key=lambda e: e["sent_s"])[:10],
        "wall_s": wall,
        "req_per_s": len(lat) / wall,
        "p50_ms": q[49] * 1e3,
        "p90_ms": q[89] * 1e3,
        "p99_ms": q[98] * 1e3,
        "max_ms": max(lat) * 1e3,
        "db_path_lookups": None if minimal else _db_path_lookups(base) - db_before,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--rate", type=float, nargs="+", default=[2.0, 10.0, 0.0])
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--repeat", type=int, default=1, help="runs per rate (each its own row)")
    ap.add_argument(
        "--target",
        choices=sorted(TARGETS),
        default="config",
        help="what the clients request; results go to load_test.* (config) or load_test_<target>.*",
    )
    ap.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the flat-out runs against a minimal uvicorn app (one after each flat-out run of tuner serve)",
    )
    ap.add_argument(
        "--listen-backlog",
        type=int,
        help="cap tuner serve's listen queue (as a kernel whose net.core.somaxconn is this small)",
    )
    ap.add_argument("--tag", help="results go to load_test_<tag>.* instead")
    ap.add_argument("--burst", type=int, default=100, help="new connections opened at once during each flat-out run")
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], help="the main port's event loop (default: tuner serve's)")
    ap.add_argument("--probe", metavar="URL", nargs="+", help=argparse.SUPPRESS)  # the probe process's entry point
    ap.add_argument("--burst-of", nargs=2, metavar=("N", "URL"), help=argparse.SUPPRESS)  # the burst process's
    ap.add_argument("--out", type=Path, help="folder the results are written to (required)")
    args = ap.parse_args()
    if args.probe:
        print(json.dumps(probe(args.probe, args.max_seconds)))
        return
    if args.burst_of:
        print(json.dumps(burst(args.burst_of[1], int(args.burst_of[0]), args.max_seconds)))
        return
    if args.out is None:  # the probe and burst processes write to stdout; a run writes files
        ap.error("the following arguments are required: --out")
    tmp = Path(tempfile.mkdtemp())
    env = _database(tmp)
    port, minimal_port, health_port = free_port(), free_port(), free_port()
    env["TUNER_HEALTH_PORT"] = str(health_port)
    load_at_start = os.getloadavg()
    minimal = None if args.no_baseline else _minimal_uvicorn(tmp, minimal_port)
    results = []
    try:
        changed = args.listen_backlog is not None or args.loop is not None
        wrap = (sys.executable, "-c", SERVE_CHANGED, str(args.listen_backlog or 0), args.loop or "default")
        wrap = wrap if changed else ()
        with running_server(env, port=port, wrap=wrap) as server:
            import urllib.request

            urllib.request.urlopen(f"http://127.0.0.1:{port}/config?H=8&q_len=9&prefix=1", timeout=10).read()  # warm
            time.sleep(0.5)
            for rate in args.rate:
                for _ in range(args.repeat):
                    health = f"http://127.0.0.1:{health_port}"
                    results.append(_one(f"http://127.0.0.1:{port}", args, rate, pid=server.pid, health=health))
                    if rate == 0 and minimal is not None:
                        results.append(
                            _one(f"http://127.0.0.1:{minimal_port}", args, rate, pid=minimal.pid, minimal=True)
                        )
    finally:
        if minimal is not None:
            minimal.terminate()
            minimal.wait(10)
    log = _unusual(server.stdout.read())
    notes = {"load_at_start": load_at_start, "server_log": log, "backlog": args.listen_backlog, "loop": args.loop}
    write(args.out, results, args.target, tag=args.tag, **notes)


def _unusual(log: str) -> list[str]:
    """The server's log lines other than uvicorn's start and stop (a pause in accepting
    connections, an exception, a warning), kept with the results: nothing reads them meanwhile."""
    usual = ("Started server", "Waiting for application", "Application startup", "Uvicorn running", "Shutting down")
    usual += ("Application shutdown", "Finished server", "health probes on", "listening on", "ready: the database")
    usual += ("stopped",)
    return [ln for ln in log.splitlines() if ln.strip() and not any(u in ln for u in usual)][:50]


def _somaxconn() -> int | None:
    """The kernel's cap on a listen queue (uvicorn asks for 2048)."""
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text())
    except (OSError, ValueError):
        return None


def _one(
    base: str, args: argparse.Namespace, rate: float, *, pid: int, minimal: bool = False, health: str = ""
) -> dict:
    """One run, with health probes (main port, health port) in their own process while it lasts
    (tuner serve only), and what else used the machine meanwhile (other processes' CPU, steal)."""
    load_1m = os.getloadavg()[0]
    before, tcp_before = _cpu_seconds(pid), _tcp_counters()
    prober = None if minimal else _probe_during([base, health] if health else [base], args.max_seconds)
    burster = (
        _burst_during(base, args.burst, args.max_seconds / 3) if rate == 0 and args.burst and not minimal else None
    )
    res = asyncio.run(run(base, args.clients, args.requests, rate, args.max_seconds, args.target, minimal))
    res = {"server": "minimal uvicorn" if minimal else "tuner serve", "load_1m_before": load_1m} | res
    if prober is not None:
        res |= _probe_summary(prober)
    if burster is not None:
        res |= burst_summary(json.loads(burster.communicate(timeout=120)[0]))
    res |= _others(before, _cpu_seconds(pid), res["wall_s"])
    res |= {k: v - tcp_before[k] for k, v in _tcp_counters().items()}
    print(json.dumps(res))
    return res


def _cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far: the machine's (busy, steal), the server's, this process's and its
    reaped children's (the prober)."""
    tick = os.sysconf("SC_CLK_TCK")
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    server = [int(x) for x in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]]
    me, kids = os.times(), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "busy": (user + nice + system + irq + softirq) / tick,
        "steal": steal / tick,
        "ours": sum(server) / tick + me.user + me.system + kids.ru_utime + kids.ru_stime,
    }


def _tcp_counters() -> dict[str, int]:
    """The kernel's count of connections dropped because a listen queue was full, and of SYNs
    sent again: a connection dropped there is retried after 1, 3, 7 s, which to the load looks
    like a request unanswered for seconds while the server answers everyone else (machine-wide
    counters: other processes' listeners count too)."""
    try:
        head, values = [
            ln.split() for ln in Path("/proc/net/netstat").read_text().splitlines() if ln.startswith("TcpExt")
        ]
    except (OSError, ValueError):
        return {}
    counters = dict(zip(head[1:], map(int, values[1:]), strict=True))
    names = {"listen_overflows": "ListenOverflows", "listen_drops": "ListenDrops", "syn_retransmits": "TCPSynRetrans"}
    return {ours: counters.get(theirs, 0) for ours, theirs in names.items()}


def _others(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
    """Cores' worth of CPU that processes other than this benchmark's used during the run, and
    that the hypervisor stole: what says the machine was shared."""
    busy, ours = after["busy"] - before["busy"], after["ours"] - before["ours"]
    return {
        "other_cpu_cores": round(max(0.0, busy - ours) / wall, 2),
        "steal_cores": round((after["steal"] - before["steal"]) / wall, 2),
    }


def _database(tmp: Path) -> dict[str, str]:
    """A migrated SQLite database with five tuned H=8 q=9 rows; the environment to serve it."""
    env = {"TUNER_DATABASE_URL": f"sqlite:///{tmp / 'c.db'}", "TUNER_DEVICE": "h200"}
    full = {**os.environ, **env}
    subprocess.run([sys.executable, "-m", "tuner", "db", "upgrade"], env=full, check=True, capture_output=True)
    structure = {"STAGES": 2, "QT": 0, "WR": 2, "WK": 4, "SF": 0, "PIPE": 1}
    rows = [
        {"device": "h200", "H": 8, "q_len": 9, "prefix": p, "NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256, **structure}
        for p in (1024, 4096, 16384, 46000, 131072)
    ]
    (tmp / "rows.json").write_text(json.dumps(rows))
    subprocess.run(
        [sys.executable, "-m", "tuner", "configs", "import", str(tmp / "rows.json")],
        env=full,
        check=True,
        capture_output=True,
    )
    return env


def write(
    out: Path,
    results: list[dict],
    target: str = "config",
    load_at_start: tuple[float, float, float] | None = None,
    server_log: list[str] | None = None,
    backlog: int | None = None,
    tag: str | None = None,
    loop: str | None = None,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "cpu": _cpu_model(),
        "load_avg_at_start": load_at_start,
        "load_avg_at_end": os.getloadavg(),
        "somaxconn": _somaxconn(),
        "server_log": server_log,
        "listen_backlog": backlog,
        "loop": loop or "tuner serve's",
        "python": platform.python_version(),
        "results": results,
    }
    stem = f"load_test_{tag}" if tag else "load_test" if target == "config" else f"load_test_{target}"
    (out / f"{stem}.json").write_text(json.dumps(meta | {"target": target}, indent=1))
    lines = [
        f"# Load test of `tuner serve` — {meta['date']}, {meta['machine']} (server and clients share them)",
        "",
        f"CPU: {meta['cpu']}; Python {meta['python']}. {_load_line(meta, results)}",
        "",
        (
            f"{TARGETS[target]} over loopback to one `tuner serve` "
            f"process (uvicorn, event loop: {meta['loop']}; SQLite). Each "
            "client holds one keep-alive connection and sends Poisson-spaced requests at the given rate; "
            "latency is measured at the client (a minimal asyncio HTTP/1.1 client, sharing the 2 cores). "
            "Rate 'max' = back to back: that row measures capacity, its latency is queueing."
        ),
        "",
        (
            "| server | clients | rate/client (req/s) | requests | errors | req/s | p50 ms | p90 ms | p99 ms | max ms | "
            "DB-path lookups | main port: probes (failed, > 250 ms) | /healthz p50 / max | /readyz p50 / max | "
            "health port: probes (failed, > 250 ms) | /healthz p50 / max | /readyz p50 / max | "
            "other CPU, steal (cores) | listen overflows, SYN retransmits | "
            "new-connection burst: n (failed, > 1 s) | burst first byte p50 / max ms |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.get('server', 'tuner serve')} | {r['clients']} | {r['rate_per_client'] or 'max'} | {r['sent']} | "
            f"{r['errors']} | {r['req_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | "
            f"{r['max_ms']:.1f} | {'' if r.get('db_path_lookups') is None else r['db_path_lookups']} | "
            f"{_probe_cells(r, 'probe')} | {_probe_cells(r, 'health_port_probe')} | "
            f"{r.get('other_cpu_cores', '')}, {r.get('steal_cores', '')} | "
            f"{r.get('listen_overflows', '')}, {r.get('syn_retransmits', '')} | {_burst_cells(r)} |"
        )
    lines += _ratio_lines(results)
    lines += _error_lines(results)
    cap = f"{meta['somaxconn']}" + (f"; this run capped tuner serve's listen backlog at {backlog}" if backlog else "")
    lines += ["", f"Listen queue cap (net.core.somaxconn): {cap}. Server log, other than start and stop: "]
    lines[-1] += "; ".join(f"`{ln}`" for ln in meta["server_log"]) if meta["server_log"] else "nothing."
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def _error_lines(results: list[dict]) -> list[str]:
    """When the errors happened: on a connection's first request (a connection the server never
    served) or later (a server that stopped answering)."""
    out = []
    for n, r in enumerate(results, 1):
        if r.get("first_errors"):
            first = "; ".join(
                f"{e['kind']} on request {e['request']} of a connection opened {e['connected_s']:.2f} s in, "
                f"sent {e['sent_s']:.2f} s in"
                for e in r["first_errors"][:3]
            )
            out += ["", f"Row {n}'s first errors (of {r['errors']}): {first}."]
    return out


def _burst_cells(r: dict) -> str:
    if "burst" not in r:
        return " | "
    p50, top = (f"{r[k]:.0f}" if r[k] is not None else "-" for k in ("burst_p50_ms", "burst_max_ms"))
    return f"{r['burst']} ({r['burst_failed']}, {r['burst_over_1s']}) | {p50} / {top}"


def _probe_cells(r: dict, prefix: str) -> str:
    if f"{prefix}s" not in r:
        return " | | "
    paths = (" / ".join(str(v) for v in r.get(f"{prefix}_{p}_p50_max_ms", [])) for p in ("healthz", "readyz"))
    return f"{r[f'{prefix}s']} ({r[f'{prefix}_failed']}, {r[f'{prefix}_over_250ms']}) | " + " | ".join(paths)


def _load_line(meta: dict, results: list[dict]) -> str:
    """Whether the machine was shared: its load average, and the CPU other processes used."""
    start, end = meta["load_avg_at_start"], meta["load_avg_at_end"]
    text = f"Load average (1/5/15 min) at the start {' '.join(f'{x:.2f}' for x in start)}; " if start else ""
    text += f"at the end {' '.join(f'{x:.2f}' for x in end)}."
    others = max((r.get("other_cpu_cores", 0.0) for r in results), default=0.0)
    if others >= 0.1:
        text += (
            f" The machine was shared: other processes used up to {others:.2f} cores during a run "
            "(the last column), which this benchmark's numbers do not separate out."
        )
    return text


def _ratio_lines(results: list[dict]) -> list[str]:
    """tuner serve's flat-out req/s against the minimal uvicorn app's, run by run in the same session."""
    ours = [r["req_per_s"] for r in results if r.get("server") == "tuner serve" and r["rate_per_client"] == 0]
    base = [r["req_per_s"] for r in results if r.get("server") == "minimal uvicorn"]
    if not ours or not base:
        return []
    ratios = [a / b for a, b in zip(ours, base, strict=False)]
    return [
        "",
        (
            f"Flat out, tuner serve answered {min(ratios):.2f}-{max(ratios):.2f}x the requests per second of a "
            "minimal uvicorn app (uvicorn's defaults, one fixed body) run right after it on the same machine "
            f"({', '.join(f'{a:.0f}/{b:.0f}' for a, b in zip(ours, base, strict=False))} req/s)."
        ),
        "",
        (
            "Probes: a new connection per request to /healthz and /readyz, on the main port and on the health "
            "port (TUNER_HEALTH_PORT), every 0.25 s from a separate process during each tuner serve run "
            "(1 s timeout, the first bytes of the answer timed)."
        ),
    ]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
