"""The table a worker's config client holds: per batch bucket, its entries by prefix bucket and
the ranges of the tuner's graph plan set, read from a sidecar's table or an engine config file
with every config checked to run on the device before it is used; and the built-in heuristic's
table. Needs only the bare package (verify_tuner.engine.client imports it)."""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from verify_tuner import batches, buckets
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.kernels.validate import check
from verify_tuner.keys import TableKey


@dataclass(frozen=True)
class Entry:
    lo: int
    hi: int
    config: KernelConfig
    source: str  # tuned | nearest | heuristic (as the sidecar answered)


@dataclass(frozen=True)
class GraphPlanChoice:
    """What to capture in the CUDA graph of one batch size and prefix range (ConfigClient.graph_plans,
    graph_plan). `source`: "graph_plan" (a range of the tuner's plan set for the batch bucket:
    fastest in expectation over `prefix_range`, `regrets` its time / the best config's time per
    prefix bucket, (lo, hi, regret)) or "longest_prefix" (no plan held: the table's config for the
    longest prefix, for every prefix, no regrets known)."""

    config: KernelConfig
    source: str
    regrets: tuple[tuple[int, int, float], ...] = ()
    expected_us: float | None = None
    prefix_range: tuple[int, int] | None = None
    reason: str = ""


def heuristic_table(limits: DeviceLimits, key: TableKey) -> dict[int, list[Entry]]:
    """The built-in heuristic's entry for every prefix bucket of every batch bucket of `key`'s table."""
    return {
        bb.index: [
            Entry(
                b.lo,
                b.hi,
                heuristic_config(limits, H=key.H, q_len=key.q_len, prefix=b.mid, batch=bb.hi, kv_dtype=key.kv_dtype),
                "heuristic",
            )
            for b in buckets.ALL
        ]
        for bb in batches.ALL
    }


def engine_file_configs(doc: dict) -> list[dict]:
    """An engine config file's entries in the shape of a sidecar table's (`bucket`, `batch_bucket`);
    ValueError when the file's table is malformed."""
    with _malformed():
        return [
            {
                **e,
                "bucket": {"lo": e["prefix_lo"], "hi": e["prefix_hi"]},
                "batch_bucket": {"index": batches.bucket_of(int(hi)).index},
            }
            for hi, entries in doc["configs"].items()
            for e in entries
        ]


def engine_file_plans(doc: dict) -> list[dict]:
    """An engine config file's graph plan ranges: `graph_plan_ranges` (an object keyed by batch
    bucket of lists, in prefix order), else, in a file written before ranges, `graph_plans` (one plan
    a batch bucket; absent in older files still)."""
    ranges = doc.get("graph_plan_ranges")
    if ranges is not None:
        if not isinstance(ranges, dict) or not all(isinstance(r, list) for r in ranges.values()):
            raise ValueError("malformed table: graph_plan_ranges must be an object of lists")
        return [r for rs in ranges.values() for r in rs]
    plans = doc.get("graph_plans", {})
    if not isinstance(plans, dict):  # ValueError, as every malformed table: the client passes the file over
        raise ValueError(f"malformed table: graph_plans must be an object, not {type(plans).__name__}")  # noqa: TRY004
    return list(plans.values())


def parse_table(
    configs: list[dict], graph_plans: list[dict] | None, limits: DeviceLimits | None, key: TableKey
) -> tuple[dict[int, list[Entry]], dict[int, tuple[GraphPlanChoice, ...]]]:
    """The entries (sorted by prefix) and graph plan ranges (in prefix order) per batch bucket index.
    ValueError when the table is malformed (a field missing or of the wrong type, a constant out of
    range, a batch bucket's ranges not one set that tiles its range), a config or plan cannot run on
    `limits` (None: unchecked), a batch bucket is missing or a batch bucket's entries do not cover
    every prefix from 0 to buckets.MAX_PREFIX."""
    with _malformed():
        by_batch: dict[int, list[Entry]] = {}
        for c in configs:
            by_batch.setdefault(int(c["batch_bucket"]["index"]), []).append(_entry(c))
        docs: dict[int, list[dict]] = {}
        for d in graph_plans or []:
            docs.setdefault(int(d["batch_bucket"]["index"]), []).append(d)
        plans = {bb: _plan_set(bb, ds) for bb, ds in docs.items()}
    _check_device(by_batch, limits, key)
    if set(by_batch) != {bb.index for bb in batches.ALL}:
        raise ValueError(f"table holds batch buckets {sorted(by_batch)}, not all {len(batches.ALL)}")
    for entries in by_batch.values():
        entries.sort(key=lambda e: e.lo)
        if entries[0].lo != 0 or any(a.hi != b.lo for a, b in itertools.pairwise(entries)):
            raise ValueError("table does not cover every prefix")
        if entries[-1].hi != buckets.ALL[-1].hi:  # lookup() of a longer prefix would raise in the hot path
            raise ValueError(f"table covers prefixes up to {entries[-1].hi - 1}, not {buckets.MAX_PREFIX}")
    if unknown := set(plans) - {bb.index for bb in batches.ALL}:
        raise ValueError(f"table holds graph plans for batch buckets {sorted(unknown)}, which do not exist")
    for p in (p for ranges in plans.values() for p in ranges):
        if limits is not None and (why := check(p.config, limits, H=key.H, q_len=key.q_len, kv_dtype=key.kv_dtype)):
            raise ValueError(f"graph plan {p.config} cannot run on {limits.name}: {why}")
    return by_batch, plans


#: What every range of one plan set says alike (api/schemas.GraphPlanOut); a table from before
#: ranges has none of them, each of its plans a set of one.
_SET_FIELDS = ("range_count", "breakpoints", "weights_digest", "measured_at", "set_prefix_lo", "set_prefix_hi")


def _plan_set(bb: int, docs: list[dict]) -> tuple[GraphPlanChoice, ...]:
    """A batch bucket's ranges in prefix order. ValueError unless they are every range of one set,
    each starting where the one before ends: a worker must never capture ranges of two sets."""
    docs = sorted(docs, key=lambda d: d.get("range_index", 0))
    ranges = tuple(_plan_choice(d) for d in docs)
    shared = {f: [d.get(f) for d in docs] for f in _SET_FIELDS}
    count = docs[0].get("range_count", 1)
    starts = [r.prefix_range[0] for r in ranges[1:]]  # type: ignore[index]
    ends = [r.prefix_range[1] for r in ranges[:-1]]  # type: ignore[index]
    if (
        any(len({repr(v) for v in values}) > 1 for values in shared.values())
        or [d.get("range_index", 0) for d in docs] != list(range(count))
        or starts != ends
        or docs[0].get("breakpoints", []) != starts
    ):
        raise ValueError(f"malformed table: the graph plans of batch bucket {bb} are not the ranges of one set")
    return ranges


@contextlib.contextmanager
def _malformed() -> Iterator[None]:
    """A table's bad field as the ValueError on which every source is passed over, with its reason."""
    try:
        yield
    except InvalidConfig as exc:
        raise ValueError(f"malformed table: {exc}") from None
    except KeyError as exc:
        raise ValueError(f"malformed table: no field {exc}") from None
    except (TypeError, AttributeError) as exc:
        raise ValueError(f"malformed table: {exc}") from None


def _entry(c: dict) -> Entry:
    lo, hi, source = c["bucket"]["lo"], c["bucket"]["hi"], c["source"]
    # lookup() bisects and compares these and `counts` tallies the sources: a wrong type would raise there
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or not isinstance(source, str):
        raise ValueError(
            f"malformed table: prefix bounds must be integers and source a name, got {lo!r}..{hi!r} {source!r}"
        )
    return Entry(lo, hi, KernelConfig.from_params({k: c[k] for k in PARAM_NAMES if k in c}), source)


def _check_device(by_batch: dict[int, list[Entry]], limits: DeviceLimits | None, key: TableKey) -> None:
    """Every config must run on this device, whatever the table's file name or source said
    (another GPU's table saved under this one's name would launch configs it cannot run)."""
    if limits is None:  # nothing to check against: the caller sees source and reason
        return
    entries = [e for es in by_batch.values() for e in es]
    bad = [(e, r) for e in entries if (r := check(e.config, limits, H=key.H, q_len=key.q_len, kv_dtype=key.kv_dtype))]
    if bad:
        e, why = bad[0]
        raise ValueError(f"{len(bad)} of {len(entries)} configs cannot run on {limits.name} (e.g. {e.config}: {why})")


def _plan_choice(p: dict) -> GraphPlanChoice:
    # what graph_plan() hands the engine: a string time or a range upside down would reach it as such
    regrets = tuple(
        (*_bounds(b["prefix_lo"], b["prefix_hi"], "graph plan bucket"), _positive(b["regret"], "regret"))
        for b in p["buckets"]
    )
    lo, hi = _bounds(p["prefix_lo"], p["prefix_hi"], "graph plan")
    expected = p.get("expected_us")
    worst = max((r for _, _, r in regrets), default=1.0)
    return GraphPlanChoice(
        KernelConfig.from_params({k: p[k] for k in PARAM_NAMES if k in p}),
        "graph_plan",
        regrets,
        None if expected is None else _positive(expected, "expected_us"),
        (lo, hi),
        f"graph plan for prefixes {lo}..{hi}, worst regret {worst:.3f}x "
        f"(measured {p.get('measured_at')} on {p.get('measured_by')})",
    )


def _bounds(lo: object, hi: object, what: str) -> tuple[int, int]:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or not 0 <= lo < hi:  # type: ignore[operator]
        raise ValueError(f"malformed table: {what} prefixes must be integers 0 <= lo < hi, got {lo!r}..{hi!r}")
    return lo, hi  # type: ignore[return-value]


def _positive(v: object, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"malformed table: {what} must be a positive finite number, got {v!r}")
    return float(v)
