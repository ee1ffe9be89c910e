"""A self-contained, read-only-mountable SQLite copy of what the sidecar serves (devices, best
configs and graph plans) from any config database, SQLite or PostgreSQL. Studies, trials and the
verification history stay behind; each best keeps its verdict, so a row verified stale is copied
marked stale and the snapshot's sidecar answers as the live one: the heuristic for its bucket, and
no neighbour borrows it (leaving the row out let a neighbour's config answer there as "nearest")."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from verify_tuner.errors import StorageError
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.store import configs_io, devices, migrate, plans
from verify_tuner.store.session import make_engine, session_factory, session_scope


def write_snapshot(source_url: str, dest: Path) -> int:
    """Write `dest` (which must not exist); returns the number of best configs copied. The file
    is in rollback-journal mode, so it opens read-only without -wal/-shm files beside it."""
    dest = dest.expanduser().resolve()
    if dest.exists():
        raise StorageError(f"{dest} exists: remove it or choose another path (a snapshot is never merged)")
    src = migrate.checked_sessions(source_url)
    with session_scope(src) as s:
        recorded = [devices.device_limits(d) for d in devices.list_devices(session=s)]
        rows = configs_io.export_rows(session=s)  # with each row's verdict and verified_at
        graph_plans = plans.list_plans(session=s)
    work = dest.with_name(dest.name + ".partial")  # built aside, renamed into place when complete
    _remove(work)
    try:
        n = _build(work, recorded, rows, graph_plans)
        os.replace(work, dest)
    finally:
        _remove(work)
    return n


def _build(
    path: Path, recorded: list[DeviceLimits], rows: list[dict[str, Any]], graph_plans: list[plans.PlanRow]
) -> int:
    url = f"sqlite:///{path}"
    migrate.upgrade(url, setting="the snapshot's DEST")
    engine = make_engine(url)
    try:
        with session_scope(session_factory(engine)) as d:
            for limits in recorded:
                devices.upsert_device(session=d, limits=limits)
            n = configs_io.import_rows(session=d, rows=rows).imported if rows else 0  # validated again on the way in
            for p in graph_plans:
                plans.upsert_plan(session=d, plan=p)
    finally:
        engine.dispose()  # leaving WAL needs the only connection to the file
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("PRAGMA journal_mode=DELETE")
    finally:
        con.close()
    return n


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
