"""The lookup routes' request path stays on the event loop: FastAPI runs a plain `def` dependency
in its threadpool, a thread hop a request that halved the sidecar's capacity when the key's query
dependency was one (3 000 -> 1 700 req/s flat out, bench/load_test.py on this VM)."""

from __future__ import annotations

import inspect

from fastapi.routing import APIRoute
from verify_tuner.api.app import create_app
from verify_tuner.settings import Settings


def _calls(dependant) -> list:  # type: ignore[no-untyped-def]
    out = [dependant.call] if dependant.call is not None else []
    for sub in dependant.dependencies:
        out += _calls(sub)
    return out


def _routes(routes) -> list[APIRoute]:  # type: ignore[no-untyped-def]
    """The app's API routes, through the routers it includes."""
    out = []
    for r in routes:
        if isinstance(r, APIRoute):
            out.append(r)
        elif hasattr(r, "original_router"):  # an included router (FastAPI keeps it whole)
            out += _routes(r.original_router.routes)
    return out


def test_the_lookup_routes_have_no_dependency_that_needs_the_threadpool(tmp_path):
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/c.db", device="h200"))
    routes = {r.path: r for r in _routes(app.routes) if "GET" in r.methods}
    for path in ("/config", "/configs"):
        deps = _calls(routes[path].dependant)[1:]  # the endpoint itself first
        sync = [getattr(d, "__name__", repr(d)) for d in deps if not inspect.iscoroutinefunction(d)]
        assert deps and sync == [], f"{path}: {sync}"
