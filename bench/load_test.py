"""Load test of a real `tuner serve` over loopback: N concurrent clients, bounded in count and
time. Writes bench/results/load_test.{md,json}.

    python bench/load_test.py --clients 200 --requests 100000 --max-seconds 10 --rate 0 2 --repeat 2
Each client keeps one connection and sends --requests lookups (or until --max-seconds), paced at
--rate per second (0 = back to back: flat out, which measures capacity and saturation latency).
Each row also records how many lookups the server answered from the database path
(`tuner_db_path_lookups_total` in /metrics, before and after): none while the data is unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
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
) -> None:
    host, port = base.removeprefix("http://").split(":")
    await asyncio.sleep(rng.random() / rate if rate > 0 else 0)  # spread the first requests
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for _ in range(n):
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
                return
            finally:
                lat.append(time.perf_counter() - t0)
            if rate > 0:  # Poisson arrivals at `rate` per second
                await asyncio.sleep(max(0.0, rng.expovariate(rate) - (time.perf_counter() - t0)))
    finally:
        writer.close()


def _db_path_lookups(base: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()
    return float(next(ln for ln in text.splitlines() if ln.startswith("tuner_db_path_lookups_total")).split()[-1])


async def run(base: str, clients: int, requests: int, rate: float, max_s: float, target: str = "config") -> dict:
    lat: list[float] = []
    errors: list[str] = []
    db_before = _db_path_lookups(base)
    deadline = time.monotonic() + max_s
    t0 = time.perf_counter()
    await asyncio.gather(
        *(client(base, requests, rate, deadline, lat, errors, random.Random(i), target) for i in range(clients))
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
        "wall_s": wall,
        "req_per_s": len(lat) / wall,
        "p50_ms": q[49] * 1e3,
        "p90_ms": q[89] * 1e3,
        "p99_ms": q[98] * 1e3,
        "max_ms": max(lat) * 1e3,
        "db_path_lookups": _db_path_lookups(base) - db_before,
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
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    env = {"TUNER_DATABASE_URL": f"sqlite:///{tmp / 'c.db'}", "TUNER_DEVICE": "h200"}
    full = {**os.environ, **env}
    subprocess.run([sys.executable, "-m", "tuner", "db", "upgrade"], env=full, check=True, capture_output=True)
    rows = [
        {"device": "h200", "H": 8, "q_len": 9, "prefix": p, "NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256}
        for p in (1024, 4096, 16384, 46000, 131072)
    ]
    (tmp / "rows.json").write_text(json.dumps(rows))
    subprocess.run(
        [sys.executable, "-m", "tuner", "configs", "import", str(tmp / "rows.json")],
        env=full,
        check=True,
        capture_output=True,
    )
    port = free_port()
    results = []
    with running_server(env, port=port):
        import urllib.request

        urllib.request.urlopen(f"http://127.0.0.1:{port}/config?H=8&q_len=9&prefix=1", timeout=10).read()  # warm
        time.sleep(0.5)
        for rate in args.rate:
            for _ in range(args.repeat):
                res = asyncio.run(
                    run(f"http://127.0.0.1:{port}", args.clients, args.requests, rate, args.max_seconds, args.target)
                )
                results.append(res)
                print(json.dumps(res))
    write(args.out, results, args.target)


def write(out: Path, results: list[dict], target: str = "config") -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "cpu": _cpu_model(),
        "load_avg_at_end": os.getloadavg(),
        "python": platform.python_version(),
        "results": results,
    }
    stem = "load_test" if target == "config" else f"load_test_{target}"
    (out / f"{stem}.json").write_text(json.dumps(meta | {"target": target}, indent=1))
    lines = [
        f"# Load test of `tuner serve` — {meta['date']}, {meta['machine']} (server and clients share them)",
        "",
        f"CPU: {meta['cpu']}; Python {meta['python']}.",
        "",
        (
            f"{TARGETS[target]} over loopback to one `tuner serve` "
            "process (uvicorn, SQLite). Each "
            "client holds one keep-alive connection and sends Poisson-spaced requests at the given rate; "
            "latency is measured at the client (a minimal asyncio HTTP/1.1 client, sharing the 2 cores). "
            "Rate 'max' = back to back: that row measures capacity, its latency is queueing."
        ),
        "",
        (
            "| clients | rate/client (req/s) | requests | errors | req/s | p50 ms | p90 ms | p99 ms | max ms | "
            "DB-path lookups |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['clients']} | {r['rate_per_client'] or 'max'} | {r['sent']} | {r['errors']} | "
            f"{r['req_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | "
            f"{r['max_ms']:.1f} | {r.get('db_path_lookups', '')} |"
        )
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


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
