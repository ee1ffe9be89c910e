"""Export and import best configs as JSON or CSV. Import checks every row and stores all of
them or none."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from kernels import kernel_hash as current_kernel_hash
from kernels.config import PARAM_NAMES, KernelConfig
from kernels.errors import InvalidConfig
from kernels.validate import check
from tuner import buckets
from tuner.db import repo
from tuner.errors import BadParameter, TunerError
from tuner.lookup import resolve_device
from tuner.workload import DTYPES, WorkloadKey

FIELDS = ["device", "kernel_hash", "dtype", "H", "q_len", "bucket", "bucket_lo", "bucket_hi", *PARAM_NAMES,
          "median_us", "p10_us", "p90_us", "default_us", "speedup", "tuned_at"]


class ImportRejected(TunerError):
    """The file was rejected whole; `errors` lists every bad row."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__(f"{len(errors)} bad row(s), nothing imported:\n" + "\n".join(errors))
        self.errors = errors


def export_rows(*, session: Session, device: str | None = None, H: int | None = None,
                q_len: int | None = None) -> list[dict[str, Any]]:
    out = []
    for r in repo.list_best(session=session, device=device, H=H, q_len=q_len):
        b = buckets.by_index(r.key.bucket)
        p = r.config.as_params()
        out.append({
            "device": r.key.device, "kernel_hash": r.key.kernel_hash, "dtype": r.key.dtype, "H": r.key.H,
            "q_len": r.key.q_len, "bucket": b.index, "bucket_lo": b.lo, "bucket_hi": b.hi, **p,
            "median_us": r.median_us, "p10_us": r.p10_us, "p90_us": r.p90_us, "default_us": r.default_us,
            "speedup": r.speedup, "tuned_at": r.tuned_at.isoformat() if r.tuned_at else None,
        })
    return out


def dumps(rows: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS)
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if r.get(k) is None else r.get(k) for k in FIELDS})
    return buf.getvalue()


def loads(text: str, fmt: str) -> list[dict[str, Any]]:
    if fmt == "json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ImportRejected([f"not valid JSON: {exc}"]) from exc
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise ImportRejected(["JSON must be a list of objects"])
        return data
    return [{k: v for k, v in r.items() if v not in ("", None)} for r in csv.DictReader(io.StringIO(text))]


@dataclass(frozen=True)
class _Parsed:
    key: WorkloadKey
    config: KernelConfig
    timing: dict[str, float | None]
    tuned_at: dt.datetime | None
    limits: Any


def _int(row: dict[str, Any], name: str) -> int:
    v = row.get(name)
    if v is None:
        raise ValueError(f"{name} is missing")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {v!r}") from None
    if f != int(f):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    return int(f)


def _float(row: dict[str, Any], name: str) -> float | None:
    v = row.get(name)
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {v!r}") from None
    if not f > 0:
        raise ValueError(f"{name} must be > 0, got {v!r}")
    return f


def _parse(session: Session, row: dict[str, Any]) -> _Parsed:
    limits = resolve_device(session=session, name=row.get("device"), default=None)
    dtype = row.get("dtype", "bf16")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    H, q_len = _int(row, "H"), _int(row, "q_len")
    if "bucket" in row:
        bucket = buckets.by_index(_int(row, "bucket"))
    else:
        bucket = buckets.bucket_of(_int(row, "prefix"))
    cfg = KernelConfig.from_params({k: row[k] for k in PARAM_NAMES if k in row})
    reason = check(cfg, limits, H=H, q_len=q_len)
    if reason:
        raise InvalidConfig(f"config {cfg} cannot run on {limits.name}: {reason}")
    tuned_at = dt.datetime.fromisoformat(row["tuned_at"]) if row.get("tuned_at") else None
    key = WorkloadKey(limits.name, str(row.get("kernel_hash") or current_kernel_hash()), dtype, H, q_len, bucket.index)
    timing = {k: _float(row, k) for k in ("median_us", "p10_us", "p90_us", "default_us")}
    return _Parsed(key, cfg, timing, tuned_at, limits)


def import_rows(*, session: Session, rows: list[dict[str, Any]]) -> int:
    """Validate all rows, then upsert them in the caller's transaction. Raises ImportRejected."""
    parsed, errors = [], []
    for i, row in enumerate(rows, start=1):
        try:
            parsed.append(_parse(session, row))
        except (ValueError, TunerError, BadParameter) as exc:
            errors.append(f"row {i}: {exc}")
    if errors:
        raise ImportRejected(errors)
    if not parsed:
        raise ImportRejected(["no rows"])
    for p in parsed:
        if repo.get_device(session=session, name=p.limits.name) is None:
            repo.upsert_device(session=session, limits=p.limits)
        repo.upsert_best(session=session, key=p.key, config=p.config, tuned_at=p.tuned_at, **p.timing)
    return len(parsed)
