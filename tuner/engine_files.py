"""Engine-style config files: one JSON file per (H, q_len, device, dtype), named the way vLLM
names its tuned kernel configs (`H=8,q_len=9,device_name=NVIDIA_H200,dtype=bf16.json`), holding
the kernel it is for and the whole answer table: batch bucket -> prefix buckets -> constants,
source (tuned / nearest / heuristic) and the measured time of tuned entries.

Reading needs nothing beyond the standard library (verify_tuner.api.client reads these with no server
dependencies installed); writing goes through verify_tuner.lookup (tuner configs dump).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from verify_tuner.files import write_shared

FORMAT = "verify-tuner/engine-config/1"
ROW_FIELDS = ("median_us", "p10_us", "p90_us", "default_us", "tuned_at")


def device_slug(device: str) -> str:
    return "_".join(device.split())


def slug(name: str) -> str:
    """`name` with every run of non-alphanumerics as one dash, for file names (reports, snapshots)."""
    return re.sub(r"[^0-9A-Za-z]+", "-", name).strip("-")


def file_name(*, H: int, q_len: int, device: str, dtype: str) -> str:
    return f"H={H},q_len={q_len},device_name={device_slug(device)},dtype={dtype}.json"


def write_atomic(path: Path, doc: dict[str, Any]) -> None:
    """`doc` as the JSON file `path` (its folder created), readable by every user (verify_tuner.files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_shared(path, json.dumps(doc, indent=1, allow_nan=False))  # valid JSON only: no Infinity / NaN


def read(path: Path) -> dict[str, Any]:
    """A file's document, checked for the format; ValueError says what is wrong."""
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path.name}: not a {FORMAT} file")
    return doc


def dump(
    *, session: Any, out_dir: Path, device: str | None = None, shapes: list[tuple[int, int]] | None = None
) -> list[Path]:
    """Write the files for every (device, H, q_len) holding tuned rows of this kernel (or only
    `device`), plus the given (H, q_len) shapes (heuristic tables where nothing is tuned)."""
    from verify_tuner import batches, lookup
    from verify_tuner.db import repo
    from verify_tuner.kernels import KERNEL_NAME, KERNEL_VERSION
    from verify_tuner.kernels import kernel_hash as current_kernel_hash

    khash = current_kernel_hash()
    rows = [r for r in repo.list_best(session=session, device=device) if r.key.kernel_hash == khash]
    wanted: set[tuple[str, int, int, str]] = {(r.key.device, r.key.H, r.key.q_len, r.key.dtype) for r in rows}
    if shapes:
        names = [device] if device else sorted({d.name for d in repo.list_devices(session=session)})
        wanted |= {(n, H, q, "bf16") for n in names for H, q in shapes}
    written = []
    for name, H, q_len, dtype in sorted(wanted):
        limits = lookup.resolve_device(session=session, name=name, default=None)
        answers = lookup.table(
            session=session,
            limits=limits,
            H=H,
            q_len=q_len,
            dtype=dtype,
            kernel_hash=khash,
            batch_buckets=[b.index for b in batches.ALL],
        )
        by_key = {
            (r.key.batch_bucket, r.key.bucket): r
            for r in rows
            if (r.key.device, r.key.H, r.key.q_len, r.key.dtype) == (limits.name, H, q_len, dtype)
        }
        table: dict[str, list[dict[str, Any]]] = {}
        for a in answers:
            entry: dict[str, Any] = {
                "prefix_lo": a.bucket.lo,
                "prefix_hi": a.bucket.hi,
                **a.config.as_params(),
                "source": a.source,
            }
            row = by_key.get((a.batch_bucket.index, a.bucket.index)) if a.source == "tuned" else None
            if row is not None:
                entry.update(
                    {
                        "median_us": row.median_us,
                        "p10_us": row.p10_us,
                        "p90_us": row.p90_us,
                        "default_us": row.default_us,
                        "tuned_at": row.tuned_at.isoformat() if row.tuned_at else None,
                    }
                )
            table.setdefault(str(a.batch_bucket.hi), []).append(entry)
        doc = {
            "format": FORMAT,
            "kernel": KERNEL_NAME,
            "kernel_version": KERNEL_VERSION,
            "kernel_hash": khash,
            "device_name": limits.name,
            "dtype": dtype,
            "H": H,
            "q_len": q_len,
            "batch_buckets": {str(b.hi): [b.lo, b.hi] for b in batches.ALL},
            "configs": table,
        }
        path = out_dir / file_name(H=H, q_len=q_len, device=limits.name, dtype=dtype)
        write_atomic(path, doc)
        written.append(path)
    return written


def distinct_configs(doc: dict[str, Any]) -> list[Any]:
    """Every distinct config a file's table serves (what a cubin bundle must hold for it)."""
    from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig

    found = {KernelConfig.from_params({k: e[k] for k in PARAM_NAMES}) for es in doc["configs"].values() for e in es}
    return sorted(found)


def tuned_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The tuned entries of a file as import rows (verify_tuner.rows.ConfigRow): what `configs import`
    restores from a dump. Heuristic and nearest entries are derived, not stored."""
    from verify_tuner import batches, buckets
    from verify_tuner.kernels.config import PARAM_NAMES

    out = []
    for hi, entries in doc["configs"].items():
        bb = batches.bucket_of(int(hi))
        for e in entries:
            if e.get("source") != "tuned":
                continue
            row = {
                "device": doc["device_name"],
                "kernel_hash": doc["kernel_hash"],
                "dtype": doc["dtype"],
                "H": doc["H"],
                "q_len": doc["q_len"],
                "bucket": buckets.bucket_of(e["prefix_lo"]).index,
                "batch_bucket": bb.index,
            }
            row.update({k: e[k] for k in PARAM_NAMES if k in e})
            row.update({k: e.get(k) for k in ROW_FIELDS if e.get(k) is not None})
            out.append(row)
    return out
