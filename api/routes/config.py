"""GET /config (one lookup) and GET /configs (the whole bucket table, with an ETag)."""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response

from api.deps import SessionDep, SettingsDep
from api.schemas import ConfigOut, ConfigTableOut
from tuner import lookup
from tuner.buckets import MAX_PREFIX

router = APIRouter(tags=["configs"])

HParam = Annotated[int, Query(gt=0, le=1024, description="attention heads on this GPU (TP8 on 64 heads: 8)")]
QParam = Annotated[int, Query(ge=1, le=64, description="draft tree nodes verified per request")]
DeviceParam = Annotated[str | None, Query(max_length=200, description="CUDA device name or alias; default: the sidecar's")]
DtypeParam = Annotated[Literal["bf16"], Query(description="element type of q / kv / o")]


@router.get("/config", response_model=ConfigOut)
def get_config(
    session: SessionDep, settings: SettingsDep, request: Request, H: HParam, q_len: QParam,
    prefix: Annotated[int, Query(ge=0, le=MAX_PREFIX, description="prefix (KV-cache) length in tokens")],
    device: DeviceParam = None, dtype: DtypeParam = "bf16",
) -> ConfigOut:
    limits = lookup.resolve_device(session=session, name=device, default=settings.device)
    ans = lookup.answer(session=session, limits=limits, H=H, q_len=q_len, prefix=prefix, dtype=dtype)
    request.app.state.metrics.lookup(ans.source)
    return ConfigOut.of(ans)


@router.get("/configs", response_model=ConfigTableOut)
def get_configs(
    session: SessionDep, settings: SettingsDep, request: Request, response: Response, H: HParam, q_len: QParam,
    device: DeviceParam = None, dtype: DtypeParam = "bf16",
) -> ConfigTableOut | Response:
    limits = lookup.resolve_device(session=session, name=device, default=settings.device)
    answers = lookup.table(session=session, limits=limits, H=H, q_len=q_len, dtype=dtype)
    body = ConfigTableOut(device=limits.name, kernel_hash=answers[0].kernel_hash, dtype=dtype, H=H, q_len=q_len,
                          configs=[ConfigOut.of(a) for a in answers])
    etag = '"' + hashlib.sha256(body.model_dump_json().encode()).hexdigest()[:32] + '"'
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers={"ETag": etag})
    response.headers["ETag"] = etag
    response.headers["Cache-Control"] = "no-cache"
    return body
