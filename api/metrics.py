"""Prometheus text-format metrics, kept in-process (one sidecar process per host)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self._latency: dict[str, list[int]] = defaultdict(lambda: [0] * (len(LATENCY_BUCKETS) + 1))
        self._latency_sum: dict[str, float] = defaultdict(float)
        self._lookups: dict[str, int] = defaultdict(int)
        self._db_errors = 0
        self._db_path = 0

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        with self._lock:
            self._requests[(route, method, status)] += 1
            counts = self._latency[route]
            for i, edge in enumerate(LATENCY_BUCKETS):
                if seconds <= edge:
                    counts[i] += 1
                    break
            else:
                counts[-1] += 1
            self._latency_sum[route] += seconds

    def lookup(self, source: str) -> None:
        with self._lock:
            self._lookups[source] += 1

    def db_error(self) -> None:
        with self._lock:
            self._db_errors += 1

    def db_path(self) -> None:
        """A lookup that had to read the database (no cached table, or the data changed)."""
        with self._lock:
            self._db_path += 1

    def render(self) -> str:
        with self._lock:
            out = ["# HELP tuner_requests_total HTTP requests by route, method and status.",
                   "# TYPE tuner_requests_total counter"]
            for (route, method, status), n in sorted(self._requests.items()):
                out.append(f'tuner_requests_total{{route="{route}",method="{method}",status="{status}"}} {n}')
            out += ["# HELP tuner_request_seconds Request latency by route.",
                    "# TYPE tuner_request_seconds histogram"]
            for route, counts in sorted(self._latency.items()):
                cum = 0
                for edge, n in zip(LATENCY_BUCKETS, counts):
                    cum += n
                    out.append(f'tuner_request_seconds_bucket{{route="{route}",le="{edge}"}} {cum}')
                cum += counts[-1]
                out.append(f'tuner_request_seconds_bucket{{route="{route}",le="+Inf"}} {cum}')
                out.append(f'tuner_request_seconds_sum{{route="{route}"}} {self._latency_sum[route]:.6f}')
                out.append(f'tuner_request_seconds_count{{route="{route}"}} {cum}')
            out += ["# HELP tuner_lookups_total Config answers by source.", "# TYPE tuner_lookups_total counter"]
            for source in ("tuned", "nearest", "heuristic"):
                out.append(f'tuner_lookups_total{{source="{source}"}} {self._lookups[source]}')
            out += ["# HELP tuner_db_errors_total Database errors seen while serving.",
                    "# TYPE tuner_db_errors_total counter", f"tuner_db_errors_total {self._db_errors}",
                    "# HELP tuner_db_path_lookups_total Lookups that read the database (no cached table, or "
                    "the data changed); none while the data is unchanged.",
                    "# TYPE tuner_db_path_lookups_total counter", f"tuner_db_path_lookups_total {self._db_path}"]
        return "\n".join(out) + "\n"


class MetricsMiddleware:
    """Plain ASGI middleware (no per-request task or body buffering) timing every request."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.request(path, scope["method"], status, time.perf_counter() - start)
