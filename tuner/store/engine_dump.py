"""`tuner configs dump`: the engine config files (verify_tuner.engine_files) written from the
config database, each table answered through verify_tuner.store.lookup as the sidecar would answer it.

Apart from verify_tuner.engine_files, which the worker client reads with the standard library
alone: this side needs the database."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from verify_tuner import batches
from verify_tuner.engine_files import FORMAT, device_slug, file_name, is_file_name, key_doc, write_atomic
from verify_tuner.files import UMASK
from verify_tuner.kernels import KERNEL_NAME, KERNEL_VERSION
from verify_tuner.kernels import kernel_hash as current_kernel_hash
from verify_tuner.kernels.formats import DEFAULT as DEFAULT_KV_DTYPE
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.keys import TableKey
from verify_tuner.store import best_configs, devices, lookup, plan_docs, plans


def dump(
    *,
    session: Any,
    out_dir: Path,
    device: str | None = None,
    shapes: list[tuple[int, int]] | None = None,
    kv_dtype: str = DEFAULT_KV_DTYPE,
) -> list[Path]:
    """Write the files for every table holding tuned rows of this kernel (on `device`, or every
    device), plus the given (H, q_len) shapes of `kv_dtype` (heuristic tables where nothing is tuned)."""
    khash = current_kernel_hash()
    device = lookup.device_name(session=session, name=device)
    rows = best_configs.list_best(session=session, device=device, kernel_hash=khash)
    wanted = {r.key.table for r in rows}
    if shapes:
        names = [device] if device else sorted({d.name for d in devices.list_devices(session=session)})
        wanted |= {TableKey(n, khash, kv_dtype, H, q) for n in names for H, q in shapes}
    written = []
    for key in sorted(wanted):
        limits = lookup.resolve_device(session=session, name=key.device, default=None)
        key = replace(key, device=limits.name)
        path = out_dir / file_name(key)
        write_atomic(path, _file_doc(session=session, limits=limits, rows=rows, key=key), mode=UMASK, dir_mode=UMASK)
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


def _file_doc(*, session: Any, limits: DeviceLimits, rows: list[best_configs.BestRow], key: TableKey) -> dict[str, Any]:
    """One engine file: the table of `key` as the sidecar answers it."""
    answers = lookup.table(session=session, limits=limits, key=key, batch_buckets=[b.index for b in batches.ALL])
    by_key = {(r.key.batch_bucket, r.key.bucket): r for r in rows if r.key.table == key}
    sets = {
        str(batches.by_index(i).hi): plan_docs.range_docs(s)
        for i, s in sorted(plans.served_sets(session=session, table=key).items())
    }
    return {
        "format": FORMAT,
        "kernel": KERNEL_NAME,
        "kernel_version": KERNEL_VERSION,
        **key_doc(key),
        "batch_buckets": {str(b.hi): [b.lo, b.hi] for b in batches.ALL},
        "configs": _configs(answers, by_key),
        # additive: readers of the format that predate plans ignore the key; those that predate ranges
        # read one plan a batch bucket here, the range of the longest prefixes (as from the sidecar)
        "graph_plans": {hi: docs[-1] for hi, docs in sets.items()},
        "graph_plan_ranges": sets,  # every range of each batch bucket's set, in prefix order
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
