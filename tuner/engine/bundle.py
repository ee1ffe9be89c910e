"""A cubin bundle: the compiled configs an inference host loads without nvcc.

The tuner (or CI) compiles every config a table serves for each target arch and writes them to
one folder with a manifest (`tuner configs dump --cubins`); an engine loads the cubin of the config
it picked from there (tuner/engine/op.py). The manifest is keyed by the kernel hash, so a bundle built
for another kernel source is refused instead of launched, and each entry by the arch, the KV cache's
format (verify_tuner.kernels.formats: a cubin reads one) and q_len it was built for.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from verify_tuner.files import UMASK, make_shared_dirs, write_shared
from verify_tuner.kernels.build import KERNEL_NAME, KERNEL_VERSION, compile_cubin, kernel_hash
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig, TunerError
from verify_tuner.kernels.formats import DEFAULT as DEFAULT_KV_DTYPE

MANIFEST = "manifest.json"


class BundleError(TunerError):
    """A bundle that is missing, for another kernel, damaged, or without the config asked for."""


class Item(NamedTuple):
    """One cubin of a bundle: a config built for q_len on `arch`, reading a `kv_dtype` cache."""

    config: KernelConfig
    q_len: int
    kv_dtype: str
    arch: str

    def entry_key(self) -> str:
        return f"{self.arch}:{self.kv_dtype}:q{self.q_len}:{self.config}"


def write_bundle(out_dir: Path, items: list[Item], *, cache_dir: Path) -> Path:
    """Compile (or take from the cache) each item and write the bundle."""
    make_shared_dirs(out_dir, mode=UMASK)  # part of `configs dump`: the operator's umask, as for any file they make
    entries = []
    for it in sorted(set(items), key=Item.entry_key):
        cubin = compile_cubin(it.config, it.q_len, it.arch, cache_dir, kv_dtype=it.kv_dtype).cubin
        digest = hashlib.sha256(cubin).hexdigest()
        name = f"{KERNEL_NAME}_{it.arch}_{it.kv_dtype}_q{it.q_len}_{digest[:16]}.cubin"
        write_shared(out_dir / name, cubin, mode=UMASK)
        entry = {"arch": it.arch, "kv_dtype": it.kv_dtype, "q_len": it.q_len, "config": it.config.as_params()}
        entries.append(entry | {"file": name, "sha256": digest})
    manifest = {
        "kernel": KERNEL_NAME,
        "kernel_version": KERNEL_VERSION,
        "kernel_hash": kernel_hash(),
        "entries": entries,
    }
    write_shared(out_dir / MANIFEST, json.dumps(manifest, indent=1) + "\n", mode=UMASK)
    return out_dir / MANIFEST


@dataclass(frozen=True)
class Bundle:
    """A bundle folder, checked against this package's kernel when opened."""

    root: Path
    entries: dict[str, dict[str, Any]]

    @classmethod
    def open(cls, root: Path) -> Bundle:
        try:
            manifest = json.loads((root / MANIFEST).read_text())
        except FileNotFoundError:
            raise BundleError(f"no cubin bundle at {root} ({MANIFEST} missing)") from None
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested past the parser's depth
            raise BundleError(
                f"unreadable cubin bundle manifest {root / MANIFEST}: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(manifest, dict):
            raise BundleError(f"cubin bundle manifest {root / MANIFEST} is not a JSON object")
        if manifest.get("kernel_hash") != kernel_hash():
            raise BundleError(
                f"the bundle at {root} is for kernel {manifest.get('kernel_hash')}, "
                f"this package launches {kernel_hash()}: rebuild it with `tuner configs dump --cubins`"
            )
        entries = {}
        try:
            for e in manifest["entries"]:
                cfg = KernelConfig.from_params(e["config"])
                entries[Item(cfg, e["q_len"], e["kv_dtype"], e["arch"]).entry_key()] = e
                if not (isinstance(e.get("file"), str) and isinstance(e.get("sha256"), str)):  # read at launch
                    raise TypeError(f"entry {e.get('config')} has no file name and sha256")
        except (KeyError, TypeError, AttributeError, InvalidConfig) as exc:  # a hand-edited or foreign manifest
            raise BundleError(
                f"cubin bundle manifest {root / MANIFEST} is malformed ({type(exc).__name__}: {exc})"
            ) from None
        return cls(root, entries)

    def has(self, cfg: KernelConfig, q_len: int, arch: str, kv_dtype: str = DEFAULT_KV_DTYPE) -> bool:
        return Item(cfg, q_len, kv_dtype, arch).entry_key() in self.entries

    def cubin(self, cfg: KernelConfig, q_len: int, arch: str, kv_dtype: str = DEFAULT_KV_DTYPE) -> bytes:
        e = self.entries.get(Item(cfg, q_len, kv_dtype, arch).entry_key())
        if e is None:
            raise BundleError(
                f"the bundle at {self.root} has no cubin for {cfg} at q_len={q_len} reading {kv_dtype} on {arch}"
            )
        try:
            data = (self.root / e["file"]).read_bytes()
        except OSError as exc:  # a bundle copied in part, or without read access for this user
            raise BundleError(
                f"cannot read {self.root / e['file']} of the bundle ({type(exc).__name__}: {exc.strerror})"
            ) from None
        if hashlib.sha256(data).hexdigest() != e["sha256"]:
            raise BundleError(f"{self.root / e['file']} does not match its manifest's sha256 (damaged or replaced)")
        return data
