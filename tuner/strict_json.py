"""JSON as our files and request bodies mean it: UTF-8, one value per key.

Python's json module lets a repeated key silently replace the first (the writer meant one of the
two; we cannot know which). It also takes `NaN`, `Infinity` and `1e999`: those are parsed, and the
row schema (verify_tuner.store.row_schema) rejects them naming the row and the field, which a parse error could
not. Errors are ValueError with one line naming the key or the byte (or saying the document nests
too deeply: json's parser recurses, and its RecursionError would be a traceback or a 500).
"""

from __future__ import annotations

import json
from typing import Any


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} in one object")
        out[key] = value
    return out


def loads(data: str | bytes) -> Any:
    """The document; ValueError (json.JSONDecodeError for syntax) with one line saying what is wrong."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r})") from None
    # a huge integer fails inside json with Python's ValueError (int max_str_digits), kept as is
    try:
        return json.loads(data, object_pairs_hook=_no_duplicates)
    except RecursionError:  # json recurses per nested [ or {: a deep enough document ran out of stack
        raise ValueError(
            "arrays or objects nested too deeply to read (a file of rows nests two levels: a list of objects)"
        ) from None
