"""`tuner configs dump`: the engine config files (verify_tuner.engine_files) written from the
config database, each table answered through verify_tuner.store.lookup as the sidecar would answer it.

Apart from verify_tuner.engine_files, which the worker client reads with the standard library
alone: this side needs the database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verify_tuner import batches
from verify_tuner.engine_files import FORMAT, device_slug, file_name, is_file_name, write_atomic
from verify_tuner.files import UMASK
from verify_tuner.kernels import KERNEL_NAME, KERNEL_VERSION
from verify_tuner.kernels import kernel_hash as current_kernel_hash
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.store import best_configs, devices, lookup, plans


def dump(
    *, session: Any, out_dir: Path, device: str | None = None, shapes: list[tuple[int, int]] | None = None
) -> list[Path]:
    """Write the files for every (device, H, q_len) holding tuned rows of this kernel (or only
    `device`), plus the given (H, q_len) shapes (heuristic tables where nothing is tuned)."""
    khash = current_kernel_hash()
    device = lookup.device_name(session=session, name=device)
    rows = [r for r in best_configs.list_best(session=session, device=device) if r.key.kernel_hash == khash]
    wanted: set[tuple[str, int, int, str]] = {(r.key.device, r.key.H, r.key.q_len, r.key.dtype) for r in rows}
    if shapes:
        names = [device] if device else sorted({d.name for d in devices.list_devices(session=session)})
        wanted |= {(n, H, q, "bf16") for n in names for H, q in shapes}
    written = []
    for name, H, q_len, dtype in sorted(wanted):
        limits = lookup.resolve_device(session=session, name=name, default=None)
        doc = _file_doc(session=session, limits=limits, rows=rows, H=H, q_len=q_len, dtype=dtype, khash=khash)
        path = out_dir / file_name(H=H, q_len=q_len, device=limits.name, dtype=dtype)
        write_atomic(path, doc, mode=UMASK, dir_mode=UMASK)  # the operator's umask, as for any file they make
        written.append(path)
    return written


def left_over(*, out_dir: Path, written: list[Path], device: str | None = None) -> list[Path]:
    """Engine config files in `out_dir` this dump did not write (of `device`, when one was dumped):
    shapes no longer tuned, a kernel since replaced. A worker reading the folder still loads them."""
    if not out_dir.is_dir():
        return []
    mine = {p.name for p in written}
    tag = f",device_name={device_slug(device)}," if device else ","
    return sorted(
        p for p in out_dir.iterdir() if is_file_name(p.name) and p.name not in mine and tag in p.name and p.is_file()
    )


def _file_doc(
    *, session: Any, limits: DeviceLimits, rows: list[best_configs.BestRow], H: int, q_len: int, dtype: str, khash: str
) -> dict[str, Any]:
    """One engine file: the table of (H, q_len, dtype) on this device as the sidecar answers it."""
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
    return {
        "format": FORMAT,
        "kernel": KERNEL_NAME,
        "kernel_version": KERNEL_VERSION,
        "kernel_hash": khash,
        "device_name": limits.name,
        "dtype": dtype,
        "H": H,
        "q_len": q_len,
        "batch_buckets": {str(b.hi): [b.lo, b.hi] for b in batches.ALL},
        "configs": _configs(answers, by_key),
        # additive: readers of the format that predate plans ignore the key
        "graph_plans": {
            str(batches.by_index(i).hi): plans.plan_doc(p)
            for i, p in sorted(
                lookup.graph_plans(
                    session=session, limits=limits, H=H, q_len=q_len, dtype=dtype, kernel_hash=khash
                ).items()
            )
        },
    }


def _configs(
    answers: list[lookup.Answer], by_key: dict[tuple[int, int], best_configs.BestRow]
) -> dict[str, list[dict[str, Any]]]:
    """Each batch bucket's entries, one a prefix bucket; a tuned one with its stored times."""
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
                    # how the times were measured: an import of the file must not relabel them back to back
                    "neighbour_mb": row.neighbour_mb,
                }
            )
        table.setdefault(str(a.batch_bucket.hi), []).append(entry)
    return table
