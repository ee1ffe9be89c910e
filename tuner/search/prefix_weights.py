"""The prefix distribution a graph plan is chosen under: how often a captured graph replays each
prefix bucket of the range it is tuned for.

Default: every bucket of the range weighted equally. An operator's production histogram comes in
as `--prefix-weights FILE`, one of

- JSON, an object of prefix -> weight: `{"1024": 5, "46000": 120.5}`;
- JSON, a list of pairs: `[[1024, 5], [46000, 120.5]]`;
- CSV with the header `prefix,weight`: one row per histogram bin (a spreadsheet's byte-order mark
  is dropped).

A prefix is an integer token count in 0..MAX_PREFIX (a histogram bin's representative length), a
weight a finite number >= 0 (counts or shares: only ratios matter). Each prefix is counted in its
bucket (verify_tuner.buckets); a prefix outside the tuned range counts at the range's nearest end
bucket (the graph replays it too, and that bucket is the closest measured one) and the plan says how
much weight that was. A prefix given twice, a weight that is negative or not finite, no weight in
total, or an unreadable file is one line naming the file and the entry (BadPrefixWeights).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from verify_tuner import buckets
from verify_tuner.errors import BadPrefixWeights

#: Bytes a weights file may have: a histogram has at most a few thousand bins.
MAX_FILE_BYTES = 4 << 20


@dataclass(frozen=True)
class PrefixWeights:
    """Normalised weight (summing to 1) per prefix bucket index of a range, every bucket of the range
    present (a bucket the histogram never hits weighs 0). `source` says where the weights came from;
    `outside` is the share of the histogram's weight that lay outside the range."""

    weights: dict[int, float]
    source: str = "equal"
    outside: float = 0.0

    @property
    def digest(self) -> str:
        """sha256 of the canonical weights: the same distribution gives the same digest whatever file
        or order it came in (it keys the stored plan)."""
        canon = json.dumps({str(b): round(w, 12) for b, w in sorted(self.weights.items())}, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()


def equal(range_buckets: list[buckets.Bucket]) -> PrefixWeights:
    if not range_buckets:
        raise BadPrefixWeights("the prefix range holds no bucket")
    return PrefixWeights({b.index: 1.0 / len(range_buckets) for b in range_buckets})


def from_histogram(
    pairs: list[tuple[int, float]], range_buckets: list[buckets.Bucket], *, source: str
) -> PrefixWeights:
    """`pairs` (prefix, weight) counted in the range's buckets (see the module)."""
    if not range_buckets:
        raise BadPrefixWeights(f"{source}: the prefix range holds no bucket")
    lo, hi = range_buckets[0].index, range_buckets[-1].index
    raw = dict.fromkeys((b.index for b in range_buckets), 0.0)
    outside = 0.0
    for prefix, weight in pairs:
        i = buckets.bucket_of(prefix).index
        if not lo <= i <= hi:
            outside += weight
        raw[min(max(i, lo), hi)] += weight
    total = sum(raw.values())
    if total <= 0:
        raise BadPrefixWeights(f"{source}: the weights sum to 0; give at least one positive weight")
    return PrefixWeights({i: w / total for i, w in raw.items()}, source=source, outside=outside / total)


def load(path: Path, range_buckets: list[buckets.Bucket]) -> PrefixWeights:
    """The weights file `path` (JSON or CSV, by its content) mapped onto the range's buckets."""
    try:
        with path.open("rb") as f:  # no more than the bound: /dev/zero or a log file must not fill memory
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise BadPrefixWeights(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > MAX_FILE_BYTES:
        raise BadPrefixWeights(f"{path}: more than {MAX_FILE_BYTES} bytes, more than a histogram needs")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BadPrefixWeights(f"{path}: not UTF-8 text") from None
    stripped = text.lstrip()
    pairs = _json_pairs(path, text) if stripped[:1] in ("{", "[") else _csv_pairs(path, text)
    if not pairs:
        raise BadPrefixWeights(f"{path}: no entries; give prefix -> weight pairs (JSON object or CSV prefix,weight)")
    seen: set[int] = set()
    for prefix, _ in pairs:
        if prefix in seen:
            raise BadPrefixWeights(f"{path}: prefix {prefix} is given twice")
        seen.add(prefix)
    return from_histogram(pairs, range_buckets, source=str(path))


def _json_pairs(path: Path, text: str) -> list[tuple[int, float]]:
    def no_duplicates(items: list[tuple[str, object]]) -> dict[str, object]:
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise BadPrefixWeights(f"{path}: prefix {dup} is given twice")
        return dict(items)

    try:
        doc = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise BadPrefixWeights(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise BadPrefixWeights(f"{path}: not a histogram ({exc})") from None
    except RecursionError:
        raise BadPrefixWeights(f"{path}: arrays or objects nested too deeply for a histogram") from None
    if isinstance(doc, dict):
        items = list(doc.items())
    elif isinstance(doc, list) and all(isinstance(p, list) and len(p) == 2 for p in doc):
        items = [(p[0], p[1]) for p in doc]
    else:
        raise BadPrefixWeights(f"{path}: expected an object of prefix -> weight or a list of [prefix, weight] pairs")
    return [_pair(path, f"entry {k!r}", k, v) for k, v in items]


def _csv_pairs(path: Path, text: str) -> list[tuple[int, float]]:
    reader = csv.reader(io.StringIO(text))
    out = []
    try:
        header = next(reader, None)
        if header is None or [h.strip().lower() for h in header] != ["prefix", "weight"]:
            raise BadPrefixWeights(
                f"{path}: a CSV weights file starts with the header `prefix,weight`, got {str(header)[:80]}"
            )
        for n, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != 2:
                raise BadPrefixWeights(f"{path}: line {n}: expected prefix,weight, got {len(row)} fields")
            out.append(_pair(path, f"line {n}", row[0], row[1]))
    except csv.Error as exc:  # a field past csv's limit, a NUL: what the reader cannot take
        raise BadPrefixWeights(f"{path}: not CSV the reader takes ({exc})") from None
    return out


def _pair(path: Path, where: str, prefix: object, weight: object) -> tuple[int, float]:
    p = _int(prefix)
    if p is None or not 0 <= p <= buckets.MAX_PREFIX:
        raise BadPrefixWeights(
            f"{path}: {where}: prefix must be an integer in 0..{buckets.MAX_PREFIX}, got {_short(prefix)}"
        )
    w = _float(weight)
    if w is None or not math.isfinite(w) or w < 0:
        raise BadPrefixWeights(f"{path}: {where}: weight must be a finite number >= 0, got {_short(weight)}")
    return p, w


def _int(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    # ASCII digits only ("²" and "١٠٠٠" are isdigit()), and no more than a prefix can have
    if isinstance(v, str) and re.fullmatch(r"[0-9]{1,9}", v.strip()):
        return int(v.strip())
    return None


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:37]}..."  # a line, however long the entry


def _float(v: object) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        if not re.fullmatch(r"[0-9eE+\-.]{1,40}", v.strip()):  # float() takes "٥" and "1_0" too
            return None
        try:
            return float(v.strip())
        except ValueError:
            return None
    return None
