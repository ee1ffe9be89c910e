"""Prometheus metrics through prometheus_client, one registry per app (tests build many apps in
one process): requests and their duration by route, answers by source, database errors, lookups
that had to read the database, the age of the data served, build info, and the process metrics
(CPU, memory, open files) the library collects."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
SOURCES = ("tuned", "nearest", "heuristic")


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, *, version: str, kernel_hash: str, kernel_version: str) -> None:
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        Info("tuner_build", "Versions this sidecar serves.", registry=r).info(
            {"version": version, "kernel_hash": kernel_hash, "kernel_version": kernel_version}
        )
        self._requests = Counter(
            "tuner_requests", "HTTP requests by route, method and status.", ("route", "method", "status"), registry=r
        )
        self._duration = Histogram(
            "tuner_request_duration_seconds",
            "Request latency by route.",
            ("route",),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._lookups = Counter("tuner_lookups", "Config answers by source.", ("source",), registry=r)
        self._by_source = {s: self._lookups.labels(s) for s in SOURCES}
        self._db_errors = Counter("tuner_db_errors", "Database errors seen while serving.", registry=r)
        self._db_path = Counter(
            "tuner_db_path_lookups",
            "Lookups that read the database (no cached table, or the data changed); none while the data is unchanged.",
            registry=r,
        )
        self._checked_at: float | None = None
        Gauge(
            "tuner_table_age_seconds",
            "Seconds since the served tables were last confirmed current against the "
            "database (grows while the database cannot be read); -1 before the first check.",
            registry=r,
        ).set_function(lambda: -1.0 if self._checked_at is None else time.monotonic() - self._checked_at)
        self._stale_rows: Any = lambda: None  # set by the app: the table cache's count
        Gauge(
            "tuner_stale_rows",
            "Stored best configs marked stale by `tuner configs verify` (not served: the heuristic answers "
            "their buckets until a re-tune), as of the last check of the database; -1 before the first.",
            registry=r,
        ).set_function(lambda: -1.0 if (n := self._stale_rows()) is None else float(n))
        # label children cached: the middleware then costs a dict lookup, not a labels() call
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (route, method, status)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = (
                self._requests.labels(route, method, str(status)),
                self._duration.labels(route),
            )
        child[0].inc()
        child[1].observe(seconds)

    def lookup(self, source: str) -> None:
        self._by_source[source].inc()

    def db_error(self) -> None:
        self._db_errors.inc()

    def db_path(self) -> None:
        """A lookup that had to read the database (no cached table, or the data changed)."""
        self._db_path.inc()

    def tables_checked(self) -> None:
        """The background check read the database's stamp: the served tables are current."""
        self._checked_at = time.monotonic()

    def count_stale_rows(self, source: Any) -> None:
        """Read the stale rows' count from `source()` (None: not known yet) when /metrics is scraped."""
        self._stale_rows = source

    def render(self) -> bytes:
        return generate_latest(self.registry)


#: Methods counted by name; any other token a client sends is counted as "other", so a client
#: inventing methods cannot add a label series per request.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"})


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
            method = scope["method"] if scope["method"] in HTTP_METHODS else "other"
            self.metrics.request(path, method, status, time.perf_counter() - start)
