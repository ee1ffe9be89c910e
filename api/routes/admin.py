"""Write endpoints (bearer token from settings; off when no token is configured)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import AfterValidator
from sqlalchemy.orm import Session, sessionmaker
from verify_tuner import buckets
from verify_tuner.api.body import read_capped
from verify_tuner.api.deadline import CommitGate, write_within
from verify_tuner.api.deps import DEVICE_PATTERN, Digits, SettingsDep, StrictQuery, WriteAuth, WriteSessions
from verify_tuner.api.file_watch import FileState
from verify_tuner.api.schemas import DeleteOut, ImportOut
from verify_tuner.errors import StorageError
from verify_tuner.keys import check_kv_dtype
from verify_tuner.store import best_configs, configs_io, lookup, plans
from verify_tuner.store.session import session_scope

router = APIRouter(tags=["admin"], dependencies=[WriteAuth, StrictQuery])


#: A client that has opened a body must finish it in this time: a trickling upload holds no worker for long.
BODY_TIMEOUT_S = 30.0
IMPORT_DEADLINES = 12


@router.post("/configs/import", response_model=ImportOut)
async def import_configs(request: Request, sessions: WriteSessions, settings: SettingsDep) -> ImportOut:
    """Rows as the CLI's import takes them: a JSON list of objects or a `tuner configs dump` file,
    or CSV with `Content-Type: text/csv` (docs/operations.md). The body is read here, after the
    token check (a router dependency): FastAPI reads a declared body parameter before any
    dependency runs. Stored whole within the deadline, or not at all (api/deadline.py)."""
    body = await read_capped(request, limit=settings.max_body_bytes, timeout_s=BODY_TIMEOUT_S)
    fmt = "csv" if request.headers.get("content-type", "").partition(";")[0].strip().lower() == "text/csv" else "json"
    try:
        loaded = configs_io.loads(body, fmt)
    except configs_io.ImportRejected as exc:
        raise HTTPException(422, {"msg": "import rejected, nothing stored", "errors": exc.errors}) from exc
    # an import runs a few statements a row: it gets more than one lookup's deadline
    seconds = settings.db_timeout_s * IMPORT_DEADLINES
    return await write_within(
        seconds, settings.db_timeout_s, lambda gate: _import(request, sessions, loaded, gate), "the import"
    )


def _import(
    request: Request, sessions: sessionmaker[Session], loaded: configs_io.Loaded, gate: CommitGate
) -> ImportOut:
    _check_file(request)
    try:
        with session_scope(sessions) as session:
            result = configs_io.import_rows(session=session, rows=loaded.rows, allow_empty=loaded.dump)
            gate.enter_commit()  # past the request's deadline this raises, and the scope rolls back
        request.app.state.tables.clear()
    except configs_io.ImportRejected as exc:
        raise HTTPException(422, {"msg": "import rejected, nothing stored", "errors": exc.errors}) from exc
    warnings = list(result.warnings)
    if loaded.plans:
        warnings.append(f"the file's {loaded.plans} graph plan(s) are not imported (`tuner db snapshot` moves them)")
    return ImportOut(imported=result.imported, warnings=warnings)


def _check_file(request: Request) -> None:
    watch = request.app.state.file_watch
    if watch.check() is FileState.MISSING:  # a pooled connection would write into the deleted file
        raise StorageError(watch.missing_reason())


@router.delete("/configs", response_model=DeleteOut)
async def delete_configs(
    request: Request,
    sessions: WriteSessions,
    settings: SettingsDep,
    device: Annotated[str, Query(max_length=200, pattern=DEVICE_PATTERN, description="CUDA name or alias")],
    H: Annotated[int | None, Digits, Query(gt=0, le=1024)] = None,
    q_len: Annotated[int | None, Digits, Query(ge=1, le=64)] = None,
    bucket: Annotated[int | None, Digits, Query(ge=0, le=len(buckets.ALL) - 1)] = None,
    kv_dtype: Annotated[
        str | None,
        Query(max_length=32, description="one KV format's rows (left out: every format's)"),
        AfterValidator(lambda v: v if v is None else check_kv_dtype(v)),
    ] = None,
) -> DeleteOut:
    return await write_within(
        settings.db_timeout_s,
        settings.db_timeout_s,
        lambda gate: _delete(request, sessions, gate, device, bucket, H=H, q_len=q_len, kv_dtype=kv_dtype),
        "the delete",
    )


def _delete(
    request: Request,
    sessions: sessionmaker[Session],
    gate: CommitGate,
    device: str,
    bucket: int | None,
    **key: int | str | None,
) -> DeleteOut:
    _check_file(request)
    with session_scope(sessions) as session:
        name = lookup.resolve_device(session=session, name=device, default=None).name  # h200 -> NVIDIA H200
        n = best_configs.delete_best(session=session, device=name, bucket=bucket, **key)
        plans_deleted = plans.delete_plans(session=session, device=name, bucket=bucket, **key)  # built from those bests
        gate.enter_commit()
    request.app.state.tables.clear()
    return DeleteOut(deleted=n, plans_deleted=plans_deleted)
