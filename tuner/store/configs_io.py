"""Export and import best configs as JSON or CSV. Import checks every row and stores all of
them or none."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session
from verify_tuner import batches, buckets, engine_files, strict_json
from verify_tuner.errors import BadParameter, TunerError
from verify_tuner.kernels import kernel_hash as current_kernel_hash
from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.kernels.validate import check
from verify_tuner.keys import ConfigKey, TableKey, specs
from verify_tuner.store import best_configs, devices
from verify_tuner.store import row_schema as rows_schema
from verify_tuner.store.lookup import device_name, resolve_device

#: The columns of an export, in order: the table key's fields (verify_tuner.keys), then the buckets.
FIELDS = [
    *(f.name for f, _ in specs(TableKey)),
    "bucket",
    "bucket_lo",
    "bucket_hi",
    "batch_bucket",
    "batch_lo",
    "batch_hi",
    *PARAM_NAMES,
    "median_us",
    "p10_us",
    "p90_us",
    "default_us",
    "speedup",
    "tuned_at",
    "verdict",
    "verified_at",
    "neighbour_mb",
]
#: Written only when set: a JSON file of rows never verified reads as before, also in older versions.
OPTIONAL_JSON_FIELDS = ("verdict", "verified_at")
#: Written only when not this value: rows timed back to back read as before, also in older versions.
JSON_DEFAULTS = {"neighbour_mb": 0}


class ImportRejected(TunerError):
    """The file was rejected whole; `errors` lists every bad row."""

    def __init__(self, errors: list[str], *, whole_file: bool = False) -> None:
        if whole_file:  # a file that is not rows at all (not JSON, not UTF-8) is not "1 bad row": one line
            super().__init__("file rejected, nothing imported: " + "; ".join(errors))
        else:
            super().__init__(f"{len(errors)} bad row(s), nothing imported:\n" + "\n".join(errors))
        self.errors = errors


def export_rows(
    *, session: Session, device: str | None = None, H: int | None = None, q_len: int | None = None
) -> list[dict[str, Any]]:
    out = []
    device = device_name(session=session, name=device)
    for r in best_configs.list_best(session=session, device=device, H=H, q_len=q_len):
        b, bb = buckets.by_index(r.key.bucket), batches.by_index(r.key.batch_bucket)
        p = r.config.as_params()
        out.append(
            {
                **r.key.table.values(),
                "bucket": b.index,
                "bucket_lo": b.lo,
                "bucket_hi": b.hi,
                "batch_bucket": bb.index,
                "batch_lo": bb.lo,
                "batch_hi": bb.hi,
                **p,
                "median_us": r.median_us,
                "p10_us": r.p10_us,
                "p90_us": r.p90_us,
                "default_us": r.default_us,
                "speedup": r.speedup,
                "tuned_at": r.tuned_at.isoformat() if r.tuned_at else None,
                "verdict": r.verdict,
                "verified_at": r.verified_at.isoformat() if r.verified_at else None,
                "neighbour_mb": r.neighbour_mb,
            }
        )
    return out


def dumps(rows: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "json":
        rows = [
            {
                k: v
                for k, v in r.items()
                if (v is not None or k not in OPTIONAL_JSON_FIELDS)
                and (k not in JSON_DEFAULTS or v != JSON_DEFAULTS[k])
            }
            for r in rows
        ]
        return json.dumps(rows, indent=2, allow_nan=False)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS)
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if r.get(k) is None else r.get(k) for k in FIELDS})
    return buf.getvalue()


@dataclass(frozen=True)
class Loaded:
    rows: list[dict[str, Any]]
    dump: bool  # a `tuner configs dump` file: its tuned entries are the rows (there may be none)
    plans: int = 0  # graph plans the dump file serves, which an import does not restore


def loads(data: str | bytes, fmt: str) -> Loaded:
    """Raw rows of a JSON or CSV file, text or UTF-8 bytes (a spreadsheet's UTF-8 byte-order mark
    is dropped); CSV cells are converted strictly (verify_tuner.store.row_schema.from_csv_cells)."""
    text = (_utf8(data) if isinstance(data, bytes) else data).removeprefix("\ufeff")
    if fmt == "json":
        try:
            doc = strict_json.loads(text)  # a repeated key or a non-finite number is an error, not last-wins
        except ValueError as exc:
            raise ImportRejected([f"not valid JSON: {exc}"], whole_file=True) from exc
        if isinstance(doc, dict) and doc.get("format") == engine_files.FORMAT:
            plans = doc.get("graph_plans")
            try:
                rows = engine_files.tuned_rows(doc)
            except ValueError as exc:
                raise ImportRejected([f"not a whole `tuner configs dump` file: {exc}"], whole_file=True) from None
            return Loaded(rows, dump=True, plans=len(plans) if isinstance(plans, dict) else 0)
        if not isinstance(doc, list) or not all(isinstance(r, dict) for r in doc):
            raise ImportRejected(["JSON must be a list of objects (or a `tuner configs dump` file)"], whole_file=True)
        return Loaded(doc, dump=False)
    return Loaded(_csv_rows(text), dump=False)


def _csv_rows(text: str) -> list[dict[str, Any]]:
    """A CSV file's typed rows. A file cut short is refused, not imported as what is left: a record
    with fewer cells than the header (DictReader fills the rest with None, read as absent: PIPE=1 was
    stored for a tuned 3), or a last record without its line break (cut inside its last cell)."""
    reader = csv.DictReader(io.StringIO(text))
    try:
        empty = [i for i, c in enumerate(reader.fieldnames or (), start=1) if not c.strip()]
        if empty:  # not a header at all, or a stray separator: say so before "repeats ''"
            cols = ", ".join(map(str, empty))
            why = f"CSV header has no name in column(s) {cols}: the first line must name the columns, as `tuner configs export --format csv` writes them"
            raise ImportRejected([why], whole_file=True)
        repeated = sorted({c for c in reader.fieldnames or () if (reader.fieldnames or []).count(c) > 1})
        if repeated:  # DictReader keeps the last of a repeated column's cells
            raise ImportRejected([f"CSV header repeats column(s) {', '.join(map(repr, repeated))}"], whole_file=True)
        records = list(reader)
    except csv.Error as exc:  # a field past csv's limit, a NUL byte: what the reader cannot take
        raise ImportRejected([f"not CSV the reader takes ({exc})"], whole_file=True) from None
    width = len(reader.fieldnames or ())
    short = [
        f"row {i}: {sum(v is None for v in r.values())} cell(s) fewer than the header's {width} columns "
        "(a file cut short?)"
        for i, r in enumerate(records, start=1)
        if any(v is None for v in r.values())
    ]
    if short:
        raise ImportRejected(short)
    if records and not text.endswith(("\n", "\r")):
        why = "the last line has no line break, as a file cut short ends (CSV writers end every line): "
        why += "add it if the file is whole"
        raise ImportRejected([why], whole_file=True)
    return [rows_schema.from_csv_cells(r) for r in records]


def _utf8(data: bytes) -> str:
    """Both formats' text; bytes that are not UTF-8 are named by offset (CSV has no decoder of its own)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ImportRejected(
            [f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}"], whole_file=True
        ) from None


@dataclass(frozen=True)
class ImportResult:
    imported: int
    #: Rows stored but never served by this kernel (another kernel hash), one line each.
    warnings: list[str]


def _parse(
    session: Session, raw: dict[str, Any], devices_seen: dict[str, DeviceLimits]
) -> tuple[best_configs.BestRow, DeviceLimits]:
    row = rows_schema.parse_row(raw)
    given = row.table_values()
    if given["device"] not in devices_seen:  # one lookup a device, not a row: imports run thousands of rows
        devices_seen[given["device"]] = resolve_device(session=session, name=given["device"], default=None)
    limits = devices_seen[given["device"]]  # never "the only recorded one"
    table = TableKey(**given | {"device": limits.name, "kernel_hash": given["kernel_hash"] or current_kernel_hash()})
    cfg = KernelConfig.from_params(row.constants())
    reason = check(cfg, limits, H=table.H, q_len=table.q_len, kv_dtype=table.kv_dtype)
    if reason:
        raise InvalidConfig(f"config {cfg} cannot run on {limits.name}: {reason}")
    timing = {k: getattr(row, k) for k in rows_schema.TIMING_FIELDS}
    best = best_configs.BestRow(
        table.at(row.bucket_index, row.batch_bucket),
        cfg,
        **timing,
        tuned_at=row.tuned_at,
        verdict=row.verdict,
        verified_at=row.verified_at,
        neighbour_mb=row.neighbour_mb,
    )
    return best, limits


def import_rows(*, session: Session, rows: list[dict[str, Any]], allow_empty: bool = False) -> ImportResult:
    """Validate all rows, then upsert them in the caller's transaction. Raises ImportRejected with
    one line per bad row (row number and field); the same key twice in one file is rejected."""
    parsed: list[tuple[best_configs.BestRow, DeviceLimits]] = []
    errors: list[str] = []
    seen: dict[ConfigKey, int] = {}
    devices_seen: dict[str, DeviceLimits] = {}
    for i, raw in enumerate(rows, start=1):
        try:
            best, limits = _parse(session, raw, devices_seen)
        except (ValueError, TunerError, BadParameter) as exc:
            errors.append(f"row {i}: {exc}")
            continue
        if best.key in seen:
            errors.append(f"row {i}: the same key as row {seen[best.key]} ({best.key})")
            continue
        seen[best.key] = i
        parsed.append((best, limits))
    if errors:
        raise ImportRejected(errors)
    if not parsed:
        if allow_empty:  # a dump of heuristic tables: nothing tuned to restore
            return ImportResult(0, [])
        raise ImportRejected(["no rows"], whole_file=True)
    current = current_kernel_hash()
    warnings = [
        f"row {seen[best.key]}: kernel hash {best.key.kernel_hash} is not this kernel's ({current}): stored, "
        "but never served by this version"
        for best, _ in parsed
        if best.key.kernel_hash != current
    ]
    _store(session, parsed)
    return ImportResult(len(parsed), warnings)


def _store(session: Session, parsed: list[tuple[best_configs.BestRow, DeviceLimits]]) -> None:
    """The checked rows, their devices recorded first, in one statement (best_configs.upsert_bests)."""
    for limits in {limits.name: limits for _, limits in parsed}.values():
        if devices.get_device(session=session, name=limits.name) is None:
            devices.upsert_device(session=session, limits=limits)
    best_configs.upsert_bests(session=session, rows=[best for best, _ in parsed])
