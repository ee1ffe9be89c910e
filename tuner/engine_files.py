"""Engine-style config files: one JSON file per answer table (verify_tuner.keys.TableKey), named
the way vLLM names its tuned kernel configs (`H=8,q_len=9,device_name=NVIDIA_H200,dtype=bf16.json`),
holding the kernel it is for and the whole answer table: batch bucket -> prefix buckets ->
constants, source (tuned / nearest / heuristic) and the measured time of tuned entries. The name
and the document's key fields come from the key's declaration: `dtype` in both is the KV cache's
element format, the key's kv_dtype (q and o are bf16 whatever it is).

Reading needs nothing beyond the standard library (verify_tuner.engine.client reads these with no server
dependencies installed); verify_tuner.store.engine_dump writes them from the config database (tuner configs dump).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from verify_tuner.files import SHARED_DIR_MODE, SHARED_MODE, make_shared_dirs, write_shared
from verify_tuner.keys import TableKey, file_parts, specs

FORMAT = "verify-tuner/engine-config/1"
ROW_FIELDS = ("median_us", "p10_us", "p90_us", "default_us", "tuned_at", "neighbour_mb")


def device_slug(device: str) -> str:
    return "_".join(device.split())


def slug(name: str) -> str:
    """`name` with every run of non-alphanumerics as one dash, for file names (reports, snapshots)."""
    return re.sub(r"[^0-9A-Za-z]+", "-", name).strip("-")


def file_name(key: TableKey) -> str:
    """The file of `key`'s table (its kernel hash is inside: one file a table of the kernel dumped)."""
    return ",".join(f"{label}={device_slug(str(v))}" for label, v in file_parts(key)) + ".json"


def _doc_names() -> dict[str, str]:
    """Key field -> its name in a file's document (the file name's label, where it has one)."""
    return {f.name: spec.file[1] if spec.file else f.name for f, spec in specs(TableKey)}


def key_doc(key: TableKey) -> dict[str, Any]:
    """The key fields of `key`'s file, under the file's names (device_name, dtype, ...)."""
    return {_doc_names()[name]: v for name, v in key.values().items()}


def doc_key_values(doc: dict[str, Any]) -> dict[str, Any]:
    """The key fields a file's document holds, by their names in verify_tuner.keys: a field added
    after the file was written takes its default; one the file must have is a DamagedDump."""
    out, missing = {}, []
    for f, spec in specs(TableKey):
        name = _doc_names()[f.name]
        if name in doc:
            out[f.name] = doc[name]
        elif spec.added:
            out[f.name] = spec.default
        else:
            missing.append(name)
    if missing:
        raise DamagedDump(f"missing {', '.join(missing)}")
    return out


def write_atomic(
    path: Path, doc: dict[str, Any], *, mode: int | None = SHARED_MODE, dir_mode: int | None = SHARED_DIR_MODE
) -> None:
    """`doc` as the JSON file `path` (its folders created), readable by every user unless the modes
    say otherwise (verify_tuner.files; UMASK: as the umask allows)."""
    make_shared_dirs(path.parent, mode=dir_mode)
    write_shared(path, json.dumps(doc, indent=1, allow_nan=False), mode=mode)  # valid JSON only: no Infinity / NaN


def is_file_name(name: str) -> bool:
    """Whether `name` is an engine config file's name (file_name's pattern, from the key's file labels)."""
    labels = [spec.file for _, spec in specs(TableKey) if spec.file]
    pattern = ",".join(f"{re.escape(label)}=[^,/]+" for _, label in sorted(labels))
    return re.fullmatch(pattern + r"\.json", name) is not None


def read(path: Path) -> dict[str, Any]:
    """A file's document, checked for the format; ValueError says what is wrong."""
    return loads(path.read_bytes(), path.name)


def loads(raw: bytes, name: str) -> dict[str, Any]:
    """A file's document from its bytes (`name` for the error), checked for the format."""
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{name}: not a {FORMAT} file")
    return doc


def distinct_configs(doc: dict[str, Any]) -> list[Any]:
    """Every distinct config a file's table or graph plans serve (what a cubin bundle must hold for it)."""
    from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig

    entries = [e for es in doc["configs"].values() for e in es]
    # a plan can name a config no bucket serves any more (re-tuned after the plan was made)
    entries += list(doc.get("graph_plans", {}).values())
    entries += [r for ranges in doc.get("graph_plan_ranges", {}).values() for r in ranges]
    return sorted({KernelConfig.from_params({k: e[k] for k in PARAM_NAMES if k in e}) for e in entries})


class DamagedDump(ValueError):
    """A dump file whose shape is not the one `tuner configs dump` writes (hand-edited or cut)."""


def tuned_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The tuned entries of a file as import rows (verify_tuner.store.row_schema.ConfigRow): what `configs import`
    restores from a dump. Heuristic and nearest entries are derived, not stored."""
    from verify_tuner import batches, buckets
    from verify_tuner.kernels.config import PARAM_NAMES

    # a hand-edited or damaged file is refused with what is wrong (ValueError), not a KeyError
    key = doc_key_values(doc)
    if "configs" not in doc:
        raise DamagedDump("missing configs")
    if not isinstance(doc["configs"], dict):
        raise DamagedDump("configs must be an object of batch size -> entries")
    out = []
    for hi, entries in doc["configs"].items():
        if not (isinstance(hi, str) and hi.isascii() and hi.isdigit() and 1 <= int(hi) <= batches.MAX_BATCH):
            raise DamagedDump(f"configs key {hi!r} is not a batch size 1..{batches.MAX_BATCH}")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise DamagedDump(f"configs[{hi!r}] must be a list of objects")
        bb = batches.bucket_of(int(hi))
        for e in entries:
            if e.get("source") != "tuned":
                continue
            lo = e.get("prefix_lo")
            if not (type(lo) is int and 0 <= lo <= buckets.MAX_PREFIX):
                raise DamagedDump(f"configs[{hi!r}]: prefix_lo {lo!r} is not a prefix 0..{buckets.MAX_PREFIX}")
            row = {
                **key,
                "bucket": buckets.bucket_of(lo).index,
                "batch_bucket": bb.index,
            }
            row.update({k: e[k] for k in PARAM_NAMES if k in e})
            row.update({k: e.get(k) for k in ROW_FIELDS if e.get(k) is not None})
            out.append(row)
    return out
