"""GET /config (one lookup) and GET /configs (the whole bucket table, with an ETag).

`batch` (default 1) picks the batch bucket; `prefix` is the batch's lookup prefix (its longest
request: verify_tuner.batches.prefix_of). `/configs?all_batches=true` is every batch bucket's table in
one response, what a worker fetches at startup."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response
from verify_tuner import batches
from verify_tuner.api.deadline import NoAnswer, within
from verify_tuner.api.deps import DEVICE_PATTERN, Digits, ReadSessions, SettingsDep, StrictQuery
from verify_tuner.api.public import tell
from verify_tuner.api.schemas import ConfigOut, ConfigTableOut
from verify_tuner.api.table_cache import Table
from verify_tuner.buckets import MAX_PREFIX
from verify_tuner.errors import BadParameter

router = APIRouter(tags=["configs"], dependencies=[StrictQuery])
log = logging.getLogger(__name__)

HParam = Annotated[int, Digits, Query(gt=0, le=1024, description="attention heads on this GPU (TP8 on 64 heads: 8)")]
QParam = Annotated[int, Digits, Query(ge=1, le=64, description="draft tree nodes verified per request")]
DeviceParam = Annotated[
    str | None,
    Query(max_length=200, pattern=DEVICE_PATTERN, description="CUDA device name or alias; default: the sidecar's"),
]
DtypeParam = Annotated[Literal["bf16"], Query(description="element type of q / kv / o")]
KernelHashParam = Annotated[
    str | None,
    Query(
        max_length=64,
        pattern=DEVICE_PATTERN,
        description="the kernel the worker launches (its verify_tuner.kernels.kernel_hash()); default: the sidecar's",
    ),
]
BatchParam = Annotated[
    int | None, Digits, Query(ge=1, le=batches.MAX_BATCH, description="requests verified in one launch (default 1)")
]


@router.get("/config", response_model=ConfigOut)
async def get_config(
    sessions: ReadSessions,
    settings: SettingsDep,
    request: Request,
    H: HParam,
    q_len: QParam,
    prefix: Annotated[int, Digits, Query(ge=0, le=MAX_PREFIX, description="prefix (KV-cache) length in tokens")],
    device: DeviceParam = None,
    dtype: DtypeParam = "bf16",
    batch: BatchParam = None,
    kernel_hash: KernelHashParam = None,
) -> Response:
    bb = batches.bucket_of(batch or 1).index
    table = await _table(request, sessions, settings, device, H, q_len, dtype, bb, kernel_hash)
    ans, body = table.pick(prefix)  # the body was rendered from ConfigOut when the table was built
    request.app.state.metrics.lookup(ans.source)
    return Response(body, media_type="application/json", headers=_stale_header(table))


async def _table(
    request: Request,
    sessions,
    settings,
    device,
    H,
    q_len,
    dtype,  # type: ignore[no-untyped-def]
    batch_bucket,
    kernel_hash,
):
    """The hot path answers from memory; the database is consulted (in the threadpool, so the
    event loop never blocks on it, and within the database deadline) only when the cached table
    is due for a re-check."""
    cache = request.app.state.tables
    default = settings.device or request.app.state.pinned_device
    key = {"device": device, "default_device": default, "H": H, "q_len": q_len, "dtype": dtype}
    key["batch_bucket"], key["kernel_hash"] = batch_bucket, kernel_hash
    table = cache.fresh(**key)
    if table is None:
        try:
            table, read_db = await within(settings.db_timeout_s, cache.table, sessions=sessions, **key)
        except NoAnswer as exc:  # no more requests wait on it: the last good table, or a 503
            cache.fail(str(exc))
            table, read_db = cache.fresh(**key), False  # type: ignore[assignment]
        if read_db:
            request.app.state.metrics.db_path()
    if table.stale:
        request.app.state.metrics.db_error()
    if table.missing:  # a worker of another kernel must not launch this kernel's configs
        raise HTTPException(404, table.missing)
    if device is None and default is None:
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
    H: HParam,
    q_len: QParam,
    device: DeviceParam = None,
    dtype: DtypeParam = "bf16",
    batch: BatchParam = None,
    all_batches: Annotated[bool, Query(description="every batch bucket's table (then no `batch`)")] = False,
    kernel_hash: KernelHashParam = None,
) -> Response:
    if all_batches and batch is not None:
        raise BadParameter("batch", "give either batch or all_batches=true, not both")
    wanted = [b.index for b in batches.ALL] if all_batches else [batches.bucket_of(batch or 1).index]
    tables = [await _table(request, sessions, settings, device, H, q_len, dtype, i, kernel_hash) for i in wanted]
    table = tables[0]
    for t in tables:
        if t.stale:
            table = t
    body = _table_body(tables, dtype=dtype, H=H, q_len=q_len)
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


def _table_body(tables: list[Table], *, dtype: str, H: int, q_len: int) -> bytes:
    """ConfigTableOut's JSON spliced from the bodies each table rendered once when it was built (the
    ones /config answers with), so a worker fleet fetching `all_batches` at startup costs a join
    and a hash per request, not a model build and serialisation of every answer."""
    answers = tables[0].answers
    head = json.dumps(
        {
            "device": tables[0].limits.name,
            "kernel_hash": answers[0].kernel_hash,
            "dtype": dtype,
            "H": H,
            "q_len": q_len,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()
    configs = b",".join(b for t in tables for b in t.bodies)
    graph_plans = b",".join(t.plan for t in tables if t.plan)
    return head[:-1] + b',"configs":[' + configs + b'],"graph_plans":[' + graph_plans + b"]}"
