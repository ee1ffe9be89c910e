"""GET /config (one lookup) and GET /configs (the whole bucket table, with an ETag).

`batch` (default 1) picks the batch bucket; `prefix` is the batch's lookup prefix (its longest
request: verify_tuner.batches.prefix_of). `/configs?all_batches=true` is every batch bucket's table in
one response, what a worker fetches at startup."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response
from sqlalchemy.orm import Session, sessionmaker
from verify_tuner import batches
from verify_tuner.api.deadline import NoAnswer, within
from verify_tuner.api.deps import Digits, ReadSessions, SettingsDep, StrictQuery
from verify_tuner.api.key_query import KeyQuery, KeyQueryDep
from verify_tuner.api.public import tell
from verify_tuner.api.schemas import ConfigOut, ConfigTableOut
from verify_tuner.api.table_cache import Table
from verify_tuner.buckets import MAX_PREFIX
from verify_tuner.errors import BadParameter
from verify_tuner.settings import Settings

router = APIRouter(tags=["configs"], dependencies=[StrictQuery])
log = logging.getLogger(__name__)

BatchParam = Annotated[
    int | None, Digits, Query(ge=1, le=batches.MAX_BATCH, description="requests verified in one launch (default 1)")
]


@router.get("/config", response_model=ConfigOut)
async def get_config(
    sessions: ReadSessions,
    settings: SettingsDep,
    request: Request,
    query: KeyQueryDep,
    prefix: Annotated[int, Digits, Query(ge=0, le=MAX_PREFIX, description="prefix (KV-cache) length in tokens")],
    batch: BatchParam = None,
) -> Response:
    table = await _table(request, sessions, settings, query, batches.bucket_of(batch or 1).index)
    ans, body = table.pick(prefix)  # the body was rendered from ConfigOut when the table was built
    request.app.state.metrics.lookup(ans.source)
    return Response(body, media_type="application/json", headers=_stale_header(table))


async def _table(
    request: Request, sessions: sessionmaker[Session], settings: Settings, query: KeyQuery, batch_bucket: int
) -> Table:
    """The hot path answers from memory; the database is consulted (in the threadpool, so the
    event loop never blocks on it, and within the database deadline) only when the cached table
    is due for a re-check."""
    cache = request.app.state.tables
    default = settings.device or request.app.state.pinned_device
    named = query.get("device")
    query = query.with_local(device=default, kernel_hash=cache.own_kernel)
    table = cache.fresh(query, batch_bucket)
    if table is None:
        try:
            table, read_db = await within(settings.db_timeout_s, cache.table, sessions, query, batch_bucket)
        except NoAnswer as exc:  # no more requests wait on it: the last good table, or a 503
            cache.fail(str(exc))
            table, read_db = cache.fresh(query, batch_bucket), False
        if read_db:
            request.app.state.metrics.db_path()
    assert table is not None  # fresh() raises, rather than answer None, while the database fails
    if table.stale:
        request.app.state.metrics.db_error()
    if table.missing:  # a worker of another kernel must not launch this kernel's configs
        raise HTTPException(404, table.missing)
    if named is None and default is None:
        _pin(request, table.limits.name)
    return table


def _pin(request: Request, name: str) -> None:
    """The only recorded device answered a request naming none: it stays the default for this
    process, as `tuner serve` pins it when one is recorded at start. A sidecar started on an empty
    database otherwise answered such requests until a second device was recorded, then 422s."""
    state = request.app.state
    if state.pinned_device is None:
        state.pinned_device = name
        log.warning("default device: %s, the only one recorded when first asked (TUNER_DEVICE/--device chooses)", name)


def _stale_header(table: Table) -> dict[str, str]:
    if not table.stale:
        return {}
    return {"X-Config-Stale": f"database unavailable, serving the last good table: {tell(table.stale)}"}


@router.get("/configs", response_model=ConfigTableOut)
async def get_configs(
    sessions: ReadSessions,
    settings: SettingsDep,
    request: Request,
    query: KeyQueryDep,
    batch: BatchParam = None,
    all_batches: Annotated[bool, Query(description="every batch bucket's table (then no `batch`)")] = False,
) -> Response:
    if all_batches and batch is not None:
        raise BadParameter("batch", "give either batch or all_batches=true, not both")
    wanted = [b.index for b in batches.ALL] if all_batches else [batches.bucket_of(batch or 1).index]
    tables = [await _table(request, sessions, settings, query, i) for i in wanted]
    table = tables[0]
    for t in tables:
        if t.stale:
            table = t
    body = _table_body(tables)
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    # a worker revalidating its copy during an outage is told the table is stale, as a full answer would be
    headers = {"ETag": etag, "Cache-Control": "no-cache"} | _stale_header(table)
    if _none_match(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


def _none_match(header: str | None, etag: str) -> bool:
    """If-None-Match as RFC 9110 compares it for GET: `*`, or any listed tag equal to ours once a weak
    W/ prefix is dropped (a compressing proxy weakens the tag it passes on)."""
    if header is None:
        return False
    tags = [t.strip() for t in header.split(",")]
    return "*" in tags or any(t.removeprefix("W/") == etag for t in tags)


def _table_body(tables: list[Table]) -> bytes:
    """ConfigTableOut's JSON spliced from the bodies each table rendered once when it was built (the
    ones /config answers with), so a worker fleet fetching `all_batches` at startup costs a join
    and a hash per request, not a model build and serialisation of every answer."""
    key = tables[0].key
    # `dtype`: kv_dtype's former name, which workers older than the rename check
    head = json.dumps(key.values() | {"dtype": key.kv_dtype}, separators=(",", ":"), ensure_ascii=False).encode()
    configs = b",".join(b for t in tables for b in t.bodies)
    graph_plans = b",".join(b for t in tables for b in t.plans)
    return head[:-1] + b',"configs":[' + configs + b'],"graph_plans":[' + graph_plans + b"]}"
