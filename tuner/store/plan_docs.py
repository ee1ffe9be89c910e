"""A graph plan set as the sidecar (GET /config, /configs) and the engine config files serve it:
one document a range, each saying which set it belongs to (api/schemas.GraphPlanOut documents
the shape, which the worker client reads from either; verify_tuner.engine.config_table)."""

from __future__ import annotations

import math
from typing import Any

from verify_tuner import batches, buckets
from verify_tuner.store.plans import PlanRow, PlanSet


def plan_doc(p: PlanRow) -> dict[str, Any]:
    """One range's own fields (range_docs adds its set's)."""
    bb = batches.by_index(p.batch_bucket)
    regrets = [b["regret"] for b in p.per_bucket]
    return {
        **p.config.as_params(),
        "batch_bucket": {"index": bb.index, "lo": bb.lo, "hi": bb.hi},
        "prefix_lo": buckets.by_index(p.range_lo).lo,
        "prefix_hi": buckets.by_index(p.range_hi).hi,
        "expected_us": p.expected_us,
        "regret_geomean": math.exp(sum(math.log(r) for r in regrets) / len(regrets)) if regrets else None,
        "regret_worst": max(regrets) if regrets else None,
        "weights_digest": p.weights_digest,
        "weights_source": p.weights.get("source"),
        "measured_at": p.measured_at.isoformat() if p.measured_at else None,
        "measured_by": p.measured_by,
        "neighbour_mb": p.neighbour_mb,
        "buckets": [
            {
                "prefix_lo": buckets.by_index(b["bucket"]).lo,
                "prefix_hi": buckets.by_index(b["bucket"]).hi,
                "prefix": b.get("prefix"),
                "weight": b.get("weight"),
                "us": b["us"],
                "best_us": b["best_us"],
                "regret": b["regret"],
            }
            for b in p.per_bucket
        ],
    }


def range_docs(s: PlanSet) -> list[dict[str, Any]]:
    """Every range of a set as served, in prefix order, each saying which set it belongs to."""
    first = s.ranges[0]
    by_count = first.by_count
    shared = {
        "range_count": len(s.ranges),
        "breakpoints": list(s.breakpoints),
        "set_prefix_lo": buckets.by_index(first.bucket_lo).lo,
        "set_prefix_hi": buckets.by_index(first.bucket_hi).hi,
        "set_expected_us": by_count[len(s.ranges) - 1] if len(by_count) >= len(s.ranges) else None,
        "expected_us_by_graphs": by_count,
        "max_graphs": first.max_graphs,
        "min_saving": first.min_saving,
    }
    return [plan_doc(p) | shared | {"range_index": i} for i, p in enumerate(s.ranges)]
