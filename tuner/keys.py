"""The tuning key: what every stored config, study, graph plan and answer table hangs off, declared
once. Its fields and what each one is (`Spec`) are read by everything that stores, asks for or
names a key: the tables' key columns (verify_tuner.store.models.key_columns), the API's query
parameters (verify_tuner.api.key_query), the row schema of import and export
(verify_tuner.store.row_schema), the engine file names (verify_tuner.engine_files.file_name), the
study names (`study_name_for`) and the caches (the sidecar's tables, the worker's snapshot), so a
new dimension is a field here, a migration, and the code that uses its value
(docs/architecture.md). Not to be confused with verify_tuner.measure.backend.Workload, what
one study measures (its prefix lengths and batch, how they are timed).

`TableKey` is the part one answer table spans (device, kernel, KV format, H, q_len: every prefix
and batch bucket of it); `ConfigKey` adds the prefix bucket and the batch bucket, one stored best.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from verify_tuner import batches, buckets
from verify_tuner.kernels.formats import DEFAULT as DEFAULT_KV_DTYPE
from verify_tuner.kernels.formats import FORMATS, KV_DTYPES
from verify_tuner.kernels.validate import MAX_Q_LEN
from verify_tuner.space import SPACE_VERSION

#: Heads per GPU a key may have: the bound every input (CLI, import, API) checks.
MAX_H = 1024


def check_kv_dtype(name: object) -> str:
    """`name` if the kernel reads that KV format; ValueError otherwise, naming the accepted ones (a
    format the kernel knows but does not read yet is refused with why: verify_tuner.kernels.formats)."""
    accepted = ", ".join(k for k in KV_DTYPES if FORMATS[k].unsupported_reason() is None)
    fmt = FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise ValueError(f"unknown kv_dtype {name!r}: accepted: {accepted}")
    reason = fmt.unsupported_reason()
    if reason:
        raise ValueError(f"{reason} (accepted: {accepted})")
    return fmt.name


@dataclass(frozen=True)
class Spec:
    """What a key field is beyond its type: what the places that store, ask for or name it read."""

    doc: str
    #: its mark before the value in the key's text form (H8, Q9, b16); the names that lead it have none
    tag: str = ""
    lo: int | None = None  # an integer's bounds, both inclusive
    hi: int | None = None
    max_len: int = 0  # a name's longest spelling (its column's width)
    #: what a caller that does not give it means, and what rows stored before it existed hold
    #: (None: it must be given)
    default: Any = None
    #: "local": left out, the caller's own one (the sidecar's device, the kernel this package launches)
    local: bool = False
    #: added after keys had names: left out of those names at its default, so they name the same key
    #: (and an existing study resumes)
    added: bool = False
    #: (position, label) in an engine file's name (vLLM's `H=8,q_len=9,device_name=...,dtype=bf16`)
    file: tuple[int, str] | None = None
    #: the value as it is kept, or ValueError naming what is accepted
    check: Callable[[Any], Any] | None = None
    #: its name in files and queries before it had this one, still read there
    formerly: str = ""


def format_label(key: Any) -> str:
    """ " <kv_dtype>" where a key's format is not the default, else "": what tells apart, where keys
    are printed by their shape, the rows of one shape in different formats."""
    return "" if key.kv_dtype == DEFAULT_KV_DTYPE else f" {key.kv_dtype}"


def _field(spec: Spec, **kw: Any) -> Any:
    return field(metadata={"spec": spec}, **kw)


@dataclass(frozen=True, order=True)
class TableKey:
    """One answer table: every prefix bucket and batch bucket of (device, kernel, KV format, H, q_len)."""

    device: str = _field(Spec("CUDA device name or alias", max_len=200, local=True, file=(2, "device_name")))
    kernel_hash: str = _field(
        Spec("the kernel the worker launches (its verify_tuner.kernels.kernel_hash())", max_len=64, local=True)
    )
    kv_dtype: str = _field(
        Spec(
            "the KV cache's element format (verify_tuner.kernels.formats): " + ", ".join(KV_DTYPES),
            max_len=16,
            default=DEFAULT_KV_DTYPE,
            file=(3, "dtype"),
            check=check_kv_dtype,
            formerly="dtype",
        )
    )
    H: int = _field(Spec("attention heads on this GPU (TP8 on 64 heads: 8)", tag="H", lo=1, hi=MAX_H, file=(0, "H")))
    q_len: int = _field(Spec("draft tree nodes verified per request", tag="Q", lo=1, hi=MAX_Q_LEN, file=(1, "q_len")))

    def __post_init__(self) -> None:
        for f, spec in specs(type(self)):
            if spec.check is not None:
                spec.check(getattr(self, f.name))

    def __str__(self) -> str:
        parts = []
        for f, spec in specs(type(self)):
            value = getattr(self, f.name)
            if not (spec.added and value == spec.default):
                parts.append(f"{spec.tag}{value}")
        return "|".join(parts)

    @classmethod
    def parse(cls, text: str) -> Any:
        """The key `str(key)` wrote (a study's workload_key attribute)."""
        parts = text.split("|")
        values: dict[str, Any] = {}
        for f, spec in specs(cls):
            if not spec.tag:
                values[f.name] = parts.pop(0)
            elif parts and parts[0].startswith(spec.tag) and parts[0][len(spec.tag) :].isdigit():
                values[f.name] = int(parts.pop(0)[len(spec.tag) :])
        if parts:
            raise ValueError(f"not a {cls.__name__}: {text!r} (left over: {'|'.join(parts)})")
        return cls(**values)

    @property
    def table(self) -> TableKey:
        """The answer table this key is of (the key itself, for a TableKey)."""
        return TableKey(**{f.name: getattr(self, f.name) for f, _ in specs(TableKey)})

    def at(self, bucket: int, batch_bucket: int = 0) -> ConfigKey:
        """The key of one prefix bucket and batch bucket of this table."""
        return ConfigKey(**self.table.values(), bucket=bucket, batch_bucket=batch_bucket)

    def values(self) -> dict[str, Any]:
        """Field name -> value, in the key's order."""
        return {f.name: getattr(self, f.name) for f, _ in specs(type(self))}


@dataclass(frozen=True, order=True)
class ConfigKey(TableKey):
    """One stored best: a table's prefix bucket (verify_tuner.buckets) and batch bucket (verify_tuner.batches)."""

    bucket: int = _field(Spec("prefix bucket index", tag="b", lo=0, hi=len(buckets.ALL) - 1))
    batch_bucket: int = _field(
        Spec("batch bucket index (0: B=1)", tag="B", lo=0, hi=len(batches.ALL) - 1, default=0, added=True), default=0
    )

    @property
    def study_name(self) -> str:
        return self.study_name_for(0)

    def study_label(self, neighbour_mb: int = 0) -> str:
        """The study's identity in the config database: the key, and how its trials are timed when
        not back to back (verify_tuner.measure.backend.Workload.neighbour_mb), so a study timed cold
        never resumes one timed back to back: their times do not compare."""
        return str(self) if not neighbour_mb else f"{self}|N{neighbour_mb}"

    def study_name_for(self, neighbour_mb: int = 0) -> str:
        # a study keeps one search space: new space, new study
        return f"verify-s{SPACE_VERSION}:" + self.study_label(neighbour_mb)


def specs(cls: type[TableKey] = ConfigKey) -> Iterator[tuple[dataclasses.Field[Any], Spec]]:
    """The fields of a key type, in order, each with what it is."""
    for f in dataclasses.fields(cls):
        yield f, f.metadata["spec"]


def field_types(cls: type[TableKey] = ConfigKey) -> dict[str, type]:
    """Each field's Python type (int or str), resolved from the annotations."""
    import typing

    return {name: tp for name, tp in typing.get_type_hints(cls).items()}


def file_parts(key: TableKey) -> list[tuple[str, Any]]:
    """(label, value) of every field an engine file's name carries, in the name's order; a field
    added later is left out at its default, so the files written before it keep their names."""
    named = [
        (spec.file, getattr(key, f.name))
        for f, spec in specs(type(key))
        if spec.file and not (spec.added and getattr(key, f.name) == spec.default)
    ]
    return [(label, value) for (_, label), value in sorted(named, key=lambda x: x[0][0])]
