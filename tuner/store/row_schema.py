"""The one schema of a best-config row, shared by import, export and the API's import.

Strict on purpose: a row that a spreadsheet, a script or a typo made wrong is rejected with one
line naming the row and the field, never stored as something else (`NSPLIT: 128.7` is not 128,
`"H": true` is not 1, an unknown column is not ignored, Infinity is not a time).
"""

from __future__ import annotations

import datetime as dt
import difflib
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from verify_tuner import batches, keys
from verify_tuner.buckets import ALL, MAX_PREFIX
from verify_tuner.kernels.config import PARAM_NAMES
from verify_tuner.kernels.timing import MAX_NEIGHBOUR_MB

TIMING_FIELDS = ("median_us", "p10_us", "p90_us", "default_us")
#: The largest time (µs) or speedup a row may carry: a launch of 1000 s is a unit mistake.
MAX_TIMING = 1e9
#: Written by export and accepted back, but derived: import ignores them after checking the type.
DERIVED_FIELDS = ("bucket_lo", "bucket_hi", "batch_lo", "batch_hi", "speedup")


def _printable(v: str) -> str:
    # one character set on every database: PostgreSQL refuses NUL, and a newline breaks listings and CSV
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in v):
        raise ValueError("must not contain control characters (NUL, newline, tab, ...)")
    return v


#: A row names the GPU it was measured on: an import has no device of its own to mean.
_REQUIRED = {"device"}


def table_key_fields(key_type: type[keys.TableKey] = keys.TableKey) -> dict[str, Any]:
    """The row's columns of the table key, made from its declaration (verify_tuner.keys): strict types
    and the key's bounds; a field left out takes its default (rows written before it existed), a
    `local` one None (this package's kernel); the name a field had before is still read."""
    types, out = keys.field_types(key_type), {}
    for f, spec in keys.specs(key_type):
        if types[f.name] is int:
            kind: Any = Annotated[StrictInt, Field(ge=spec.lo, le=spec.hi)]
        else:
            kind = Annotated[StrictStr, Field(min_length=1, max_length=spec.max_len), AfterValidator(_printable)]
        if spec.check is not None:
            kind = Annotated[kind, AfterValidator(spec.check)]
        if spec.formerly:
            kind = Annotated[kind, Field(validation_alias=AliasChoices(f.name, spec.formerly))]
        optional = spec.local and f.name not in _REQUIRED
        default = None if optional else ... if spec.default is None else spec.default
        out[f.name] = (kind | None if optional else kind, default)
    return out


class RowFields(BaseModel):
    """One best config: a row of an export or import. Its table key's columns (device, kernel hash,
    kv_dtype, H, q_len) are added from the key's declaration (ConfigRow); the prefix bucket is given
    as a bucket or a prefix, and a file without batch buckets (written before they existed) means B=1."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bucket: StrictInt | None = Field(None, ge=0, le=len(ALL) - 1)
    prefix: StrictInt | None = Field(None, ge=0, le=MAX_PREFIX)
    bucket_lo: StrictInt | None = None
    bucket_hi: StrictInt | None = None
    batch_bucket: StrictInt = Field(0, ge=0, le=len(batches.ALL) - 1)
    batch_lo: StrictInt | None = None
    batch_hi: StrictInt | None = None
    NSPLIT: StrictInt = Field(ge=1)
    HT: StrictInt = Field(ge=1)
    TK: StrictInt = Field(ge=1)
    BLOCK: StrictInt = Field(ge=1)
    # required like the four above: a row without them took KernelConfig's defaults, which are not the
    # heuristic's and were never measured, and was served as tuned
    STAGES: StrictInt = Field(ge=1)
    QT: StrictInt = Field(ge=0)
    WR: StrictInt = Field(ge=1)
    WK: StrictInt = Field(ge=1)
    SF: StrictInt = Field(ge=0)
    PIPE: StrictInt = Field(ge=0)
    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    default_us: float | None = None
    speedup: float | None = None
    tuned_at: dt.datetime | None = None
    #: optional (files without them import as before): the row's last `tuner configs verify` verdict
    #: and when, so a row verified stale stays unserved where it is imported ("failed" never marks a row)
    verdict: Literal["ok", "moved", "stale"] | None = None
    verified_at: dt.datetime | None = None
    #: how the times were measured (0, or absent: back to back; N: each launch followed by a GEMM over
    #: N MB of weights, its own time subtracted)
    neighbour_mb: StrictInt = Field(0, ge=0, le=MAX_NEIGHBOUR_MB)

    def table_values(self) -> dict[str, Any]:
        """The row's table key fields as given (kernel_hash None: not given)."""
        return {f.name: getattr(self, f.name) for f, _ in keys.specs(keys.TableKey)}

    @model_validator(mode="before")
    @classmethod
    def _one_name_a_field(cls, data: Any) -> Any:
        """A field given under its name and its former one: which was meant is not ours to guess."""
        if isinstance(data, dict):
            for f, spec in keys.specs(keys.TableKey):
                if spec.formerly and f.name in data and spec.formerly in data:
                    raise ValueError(f"give {f.name} only ({spec.formerly} is its former name)")
        return data

    @field_validator(*TIMING_FIELDS, "speedup", mode="before")
    @classmethod
    def _finite_positive(cls, v: Any) -> Any:
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, int | float):
            # pydantic turns a ValueError, not a TypeError, into the row's error
            raise ValueError(f"must be a number, got {v!r}")  # noqa: TRY004
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"must be a finite number > 0, got {v!r}")
        if v > MAX_TIMING:  # 1e308 µs was stored, and `configs list` printed 309 digits
            raise ValueError(f"must be at most {MAX_TIMING:g}, got {v!r}")
        return float(v)

    @field_validator("tuned_at", "verified_at", mode="before")
    @classmethod
    def _iso_text(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, str | dt.datetime):
            raise ValueError(f"must be an ISO 8601 date-time string, got {v!r}")
        return v

    @field_validator("tuned_at", "verified_at")
    @classmethod
    def _aware(cls, v: dt.datetime | None) -> dt.datetime | None:
        if v is None:
            return None
        if v.tzinfo is None:
            v = v.replace(tzinfo=dt.UTC)
        try:  # stored in UTC: 9999-12-31T23:59-23:59 has no UTC time, and the database said so as an outage
            v = v.astimezone(dt.UTC)
        except OverflowError:
            raise ValueError("out of range once in UTC") from None
        if not dt.datetime(1970, 1, 1, tzinfo=dt.UTC) <= v <= dt.datetime(9999, 1, 1, tzinfo=dt.UTC):
            raise ValueError(f"{v.isoformat()} is not a time a row was tuned or verified (1970..9999)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> RowFields:
        if (self.bucket is None) == (self.prefix is None):
            raise ValueError("give exactly one of bucket and prefix")
        if (self.verdict is None) != (self.verified_at is None):
            raise ValueError("give both of verdict and verified_at, or neither")
        if self.bucket is not None and (self.bucket_lo, self.bucket_hi) != (None, None):
            b = ALL[self.bucket]
            if (self.bucket_lo, self.bucket_hi) != (b.lo, b.hi):
                raise ValueError(
                    f"bucket_lo/bucket_hi {self.bucket_lo}/{self.bucket_hi} do not match bucket "
                    f"{self.bucket} [{b.lo}, {b.hi})"
                )
        bb = batches.by_index(self.batch_bucket)
        if (self.batch_lo, self.batch_hi) != (None, None) and (self.batch_lo, self.batch_hi) != (bb.lo, bb.hi):
            raise ValueError(
                f"batch_lo/batch_hi {self.batch_lo}/{self.batch_hi} do not match batch bucket "
                f"{self.batch_bucket} [{bb.lo}, {bb.hi}]"
            )
        lo, mid, hi = self.p10_us, self.median_us, self.p90_us
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"p10_us {lo} > p90_us {hi}")
        if mid is not None and ((lo is not None and lo > mid) or (hi is not None and mid > hi)):
            raise ValueError(f"median_us {mid} is outside [p10_us, p90_us]")
        return self

    def constants(self) -> dict[str, object]:
        """The row's kernel constants, all of them."""
        return {k: getattr(self, k) for k in PARAM_NAMES}

    @property
    def bucket_index(self) -> int:
        from verify_tuner.buckets import bucket_of

        return self.bucket if self.bucket is not None else bucket_of(self.prefix).index  # type: ignore[arg-type]


#: The row schema: RowFields and the table key's columns.
ConfigRow = create_model("ConfigRow", __base__=RowFields, __doc__=RowFields.__doc__, **table_key_fields())
#: Every name a row's column may have (a field's former name too: files exported before the rename).
COLUMNS = {
    name
    for field_name, info in ConfigRow.model_fields.items()
    for name in (field_name, *getattr(info.validation_alias, "choices", ()))
}

#: CSV cells are text: these fields are converted to int / float strictly before validation.
_INT_FIELDS = {
    *(name for name, tp in keys.field_types(keys.TableKey).items() if tp is int),
    "bucket",
    "prefix",
    "bucket_lo",
    "bucket_hi",
    "batch_bucket",
    "batch_lo",
    "batch_hi",
    "neighbour_mb",
    *PARAM_NAMES,
}
_FLOAT_FIELDS = {*TIMING_FIELDS, "speedup"}
#: An integer cell: ASCII digits only (int() also takes "+8", "8_0", " 8" and other scripts' digits),
#: and few enough of them to be some field's value (int() refuses over 4300 with a traceback).
_INT_TEXT = re.compile(r"-?[0-9]{1,18}")
_FLOAT_TEXT = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")


def from_csv_cells(cells: dict[str, str]) -> dict[str, Any]:
    """Typed values from one CSV record ('' is absent); '128.7' stays text and fails as an int."""
    out: dict[str, Any] = {}
    for k, v in cells.items():
        if v in ("", None):
            continue
        if k in _INT_FIELDS:
            out[k] = int(v) if _INT_TEXT.fullmatch(v) else v  # anything else fails as "not an integer"
        elif k in _FLOAT_FIELDS:
            # float() also takes '٤٢', '4_1' and ' 43': as strict as the integer cells
            out[k] = float(v) if _FLOAT_TEXT.fullmatch(v) else v  # anything else fails as "must be a number"
        else:
            out[k] = v
    return out


def parse_row(raw: dict[str, Any]) -> RowFields:
    """Validate one row; ValueError with one line per problem, each naming its field."""
    if None in raw:  # csv.DictReader's key for the cells of a record longer than its header
        raise ValueError(f"{len(raw[None])} more cell(s) than the header has columns")  # type: ignore[index]
    unknown = [k for k in raw if k not in COLUMNS]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(str(k), sorted(COLUMNS), n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(f"unknown column(s) {', '.join(hints)}")
    try:
        return ConfigRow.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        absent = [e for e in errors if e["type"] == "missing" and _where(e) in PARAM_NAMES]
        lines = [_one_line(e) for e in errors if e not in absent]
        if absent:  # one line for them all: the hint once, not once a constant
            names = " ".join(_where(e) for e in absent)
            lines.insert(0, f"{names}: required: a row gives all ten kernel constants ({' '.join(PARAM_NAMES)}), "
                            "as `tuner configs export` writes them")  # fmt: skip
        raise ValueError("; ".join(lines)) from None


def _where(err: Any) -> str:
    return ".".join(str(p) for p in err["loc"]) or "row"


def _one_line(err: Any) -> str:
    return f"{_where(err)}: {err['msg'].removeprefix('Value error, ')}"
