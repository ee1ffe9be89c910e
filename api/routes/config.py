"""GET /config (one lookup) and GET /configs (the whole bucket table, with an ETag).

`batch` (default 1) picks the batch bucket; `prefix` is the batch's lookup prefix (its longest
request: tuner.batches.prefix_of). `/configs?all_batches=true` is every batch bucket's table in
one response, what a worker fetches at startup."""

from __future__ import annotations

import collections
import hashlib
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.deps import DEVICE_PATTERN, ReadSessions, SettingsDep, SingleValued
from api.schemas import ConfigOut, ConfigTableOut
from api.table_cache import Table
from tuner import batches
from tuner.buckets import MAX_PREFIX
from tuner.errors import BadParameter

router = APIRouter(tags=["configs"], dependencies=[SingleValued])

HParam = Annotated[int, Query(gt=0, le=1024, description="attention heads on this GPU (TP8 on 64 heads: 8)")]
QParam = Annotated[int, Query(ge=1, le=64, description="draft tree nodes verified per request")]
DeviceParam = Annotated[str | None, Query(max_length=200, pattern=DEVICE_PATTERN,
                                          description="CUDA device name or alias; default: the sidecar's")]
DtypeParam = Annotated[Literal["bf16"], Query(description="element type of q / kv / o")]
BatchParam = Annotated[int | None, Query(ge=1, le=batches.MAX_BATCH,
                                         description="requests verified in one launch (default 1)")]


@router.get("/config", response_model=ConfigOut)
async def get_config(
    sessions: ReadSessions, settings: SettingsDep, request: Request, H: HParam, q_len: QParam,
    prefix: Annotated[int, Query(ge=0, le=MAX_PREFIX, description="prefix (KV-cache) length in tokens")],
    device: DeviceParam = None, dtype: DtypeParam = "bf16", batch: BatchParam = None,
) -> Response:
    table = await _table(request, sessions, settings, device, H, q_len, dtype, batches.bucket_of(batch or 1).index)
    ans, body = table.pick(prefix)  # the body was rendered from ConfigOut when the table was built
    request.app.state.metrics.lookup(ans.source)
    return Response(body, media_type="application/json", headers=_stale_header(table))


async def _table(request: Request, sessions, settings, device, H, q_len, dtype,  # type: ignore[no-untyped-def]
                 batch_bucket):
    """The hot path answers from memory; the database is consulted (in the threadpool, so the
    event loop never blocks on it) only when the cached table is due for a re-check."""
    cache = request.app.state.tables
    table = cache.fresh(device=device, default_device=settings.device, H=H, q_len=q_len, dtype=dtype,
                        batch_bucket=batch_bucket)
    if table is None:
        request.app.state.metrics.db_path()
        table = await run_in_threadpool(cache.table, sessions=sessions, device=device,
                                        default_device=settings.device, H=H, q_len=q_len, dtype=dtype,
                                        batch_bucket=batch_bucket)
    if table.stale:
        request.app.state.metrics.db_error()
    return table


def _stale_header(table: Table) -> dict[str, str]:
    if not table.stale:
        return {}
    return {"X-Config-Stale": f"database unavailable, serving the last good table: {table.stale}"}


@router.get("/configs", response_model=ConfigTableOut)
async def get_configs(
    sessions: ReadSessions, settings: SettingsDep, request: Request, H: HParam, q_len: QParam,
    device: DeviceParam = None, dtype: DtypeParam = "bf16", batch: BatchParam = None,
    all_batches: Annotated[bool, Query(description="every batch bucket's table (then no `batch`)")] = False,
) -> Response:
    if all_batches and batch is not None:
        raise BadParameter("batch", "give either batch or all_batches=true, not both")
    wanted = [b.index for b in batches.ALL] if all_batches else [batches.bucket_of(batch or 1).index]
    tables = [await _table(request, sessions, settings, device, H, q_len, dtype, i) for i in wanted]
    table = tables[0]
    for t in tables:
        if t.stale:
            table = t
    body, etag = request.app.state.table_bodies.render(tables, dtype=dtype, H=H, q_len=q_len)
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers | _stale_header(table))


class TableBodies:
    """The rendered /configs body and its ETag per combination of cached tables: a worker fleet
    starting at once asks for the same 13 tables (`all_batches`), ~113 KB of JSON whose rendering
    held the event loop for every request (bench/configs_body_cost.py, 2-core VM, through
    TestClient: 10.9 ms a request rendered, 2.4 ms kept, the same as one /config lookup). A table
    rebuilt (new data, a database error) is a new object, hence a new entry; the oldest of more
    than MAX_ENTRIES go."""

    MAX_ENTRIES = 64

    def __init__(self) -> None:
        self._bodies: collections.OrderedDict[tuple, tuple[list[Table], bytes, str]] = collections.OrderedDict()

    def render(self, tables: list[Table], *, dtype: str, H: int, q_len: int) -> tuple[bytes, str]:
        key = (dtype, H, q_len, *map(id, tables))  # the entry holds the tables: their ids stay theirs
        hit = self._bodies.get(key)
        if hit is not None:
            self._bodies.move_to_end(key)
            return hit[1], hit[2]
        answers = [a for t in tables for a in t.answers]
        body = ConfigTableOut(device=tables[0].limits.name, kernel_hash=answers[0].kernel_hash, dtype=dtype, H=H,
                              q_len=q_len, configs=[ConfigOut.of(a) for a in answers]).model_dump_json().encode()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        self._bodies[key] = (tables, body, etag)
        while len(self._bodies) > self.MAX_ENTRIES:
            self._bodies.popitem(last=False)
        return body, etag
