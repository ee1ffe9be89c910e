"""Response models, separate from the tables."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, Field, create_model
from verify_tuner.keys import TableKey, field_types, specs
from verify_tuner.store.lookup import Answer, Source


class BucketOut(BaseModel):
    index: int
    lo: int = Field(description="inclusive")
    hi: int = Field(description="exclusive")


class BatchBucketOut(BaseModel):
    index: int
    lo: int = Field(description="inclusive")
    hi: int = Field(description="inclusive")


class PlanBucketOut(BaseModel):
    prefix_lo: int = Field(description="inclusive")
    prefix_hi: int = Field(description="exclusive")
    prefix: int | None = Field(None, description="the prefix measured for this bucket")
    weight: float | None = Field(None, description="its share of the prefix distribution the plan was chosen under")
    us: float = Field(description="the plan's measured time here")
    best_us: float = Field(description="the fastest finalist's time here, measured beside it")
    regret: float = Field(description="us / best_us")


NEIGHBOUR_DOC = (
    "how the times were measured: 0 CUDA-graph replays back to back; N each launch followed by a GEMM over N MB "
    "of weights (an engine's layer: cold caches), its own time subtracted"
)


class KernelParamsOut(BaseModel):
    """A config's constants (KernelConfig.as_params), the first fields of every config answer."""

    NSPLIT: int
    HT: int
    TK: int
    BLOCK: int
    STAGES: int
    QT: int
    WR: int
    WK: int
    SF: int
    PIPE: int


class GraphPlanOut(KernelParamsOut):
    """One prefix range of this batch bucket's graph plan set (tuner study graph-plan): the config to
    capture in the CUDA graph replayed for the batch sizes of the bucket and the batches whose
    longest prefix falls in the range, with its regret at every prefix bucket of the range. The
    set's ranges, chosen together from one measurement, tile the range measured; the first one also
    serves shorter prefixes, the last one longer ones."""

    batch_bucket: BatchBucketOut
    prefix_lo: int = Field(description="this range's prefixes: inclusive (a set of one: the range measured)")
    prefix_hi: int = Field(description="exclusive")
    expected_us: float = Field(description="expected step time in this range, its prefix weights renormalised to it")
    regret_geomean: float | None
    regret_worst: float | None
    weights_digest: str
    weights_source: str | None = Field(None, description="equal, or the operator's --prefix-weights file")
    measured_at: dt.datetime | None
    measured_by: str
    neighbour_mb: int = Field(0, description=NEIGHBOUR_DOC)
    buckets: list[PlanBucketOut]
    range_index: int = Field(0, description="this range's place in its set, from 0 (shortest prefixes)")
    range_count: int = Field(1, description="ranges in the set: graphs an engine captures per batch size")
    breakpoints: list[int] = Field(
        default_factory=list,
        description="the prefixes (tokens) at which the set's ranges after the first start: a batch whose "
        "longest prefix is P replays range bisect_right(breakpoints, P)",
    )
    set_prefix_lo: int | None = Field(None, description="the range the set was measured over: inclusive")
    set_prefix_hi: int | None = Field(None, description="exclusive")
    set_expected_us: float | None = Field(
        None, description="the set's expected step time over its whole range (none for sets stored before ranges)"
    )
    expected_us_by_graphs: list[float | None] = Field(
        default_factory=list,
        description="the expected step time with 1, 2, ... graphs, the best split of each count (none: no split)",
    )
    max_graphs: int = Field(1, description="the most ranges the set could have had (--max-graphs)")
    min_saving: float = Field(0.0, description="the share of the expected time a further range had to save")


class ConfigEntryOut(KernelParamsOut):
    """One prefix bucket's answer: an entry of GET /configs (GET /config adds the graph plan)."""

    source: Source = Field(
        description="heuristic also where the bucket's tuned row was verified stale (see stale_verified_at)"
    )
    bucket: BucketOut
    batch_bucket: BatchBucketOut = Field(description="batch sizes this config serves; tuned rows never cross it")
    device: str
    kernel_hash: str
    kv_dtype: str = Field(description="the KV cache's format the config is for (verify_tuner.kernels.formats)")
    expected_us: float | None
    neighbour_mb: int | None = Field(None, description=NEIGHBOUR_DOC + "; none without expected_us")
    speedup_vs_default: float | None
    tuned_at: dt.datetime | None
    tuned_bucket: int | None = Field(None, description="bucket the config was tuned on (nearest/tuned)")
    stale_verified_at: dt.datetime | None = Field(
        None,
        description="the bucket's tuned row no longer wins (tuner configs verify, at this time): it is not "
        "served, the heuristic answers until a re-tune",
    )

    @classmethod
    def of(cls, a: Answer) -> ConfigEntryOut:
        b, bb = a.bucket, a.batch_bucket
        return cls(
            **a.config.as_params(),
            source=a.source,
            bucket=BucketOut(index=b.index, lo=b.lo, hi=b.hi),
            batch_bucket=BatchBucketOut(index=bb.index, lo=bb.lo, hi=bb.hi),
            device=a.device,
            kernel_hash=a.kernel_hash,
            kv_dtype=a.kv_dtype,
            expected_us=a.expected_us,
            neighbour_mb=a.neighbour_mb,
            speedup_vs_default=a.speedup_vs_default,
            tuned_at=a.tuned_at,
            tuned_bucket=a.from_bucket,
            stale_verified_at=a.stale_verified_at,
        )


class ConfigOut(ConfigEntryOut):
    graph_plan: GraphPlanOut | None = Field(
        None,
        description="the range of the batch bucket's graph plan set that holds this prefix, if a set was chosen "
        "(its breakpoints say where the others start; GET /configs lists every range in graph_plans)",
    )


def _table_fields() -> dict[str, Any]:
    """GET /configs' fields: the table's key first, from its declaration (verify_tuner.keys.TableKey;
    the device by its recorded name), then its answers."""
    types = field_types(TableKey)
    return {f.name: (types[f.name], Field(description=spec.doc)) for f, spec in specs(TableKey)} | {
        "dtype": (str, Field(description="deprecated: kv_dtype, under the name workers before kv_dtype read")),
        "configs": (list[ConfigEntryOut], ...),
        "graph_plans": (
            list[GraphPlanOut],
            Field(
                default_factory=list,
                description="every range of the graph plan set of each batch bucket answered that has one, by "
                "batch bucket, then prefix (a worker that keeps one plan a batch bucket keeps the last: the "
                "longest prefixes')",
            ),
        ),
    }


ConfigTableOut = create_model("ConfigTableOut", __doc__="An answer table (GET /configs).", **_table_fields())


class ImportOut(BaseModel):
    imported: int
    warnings: list[str] = Field(
        default_factory=list, description="rows stored but never served by this kernel (another kernel hash)"
    )


class DeleteOut(BaseModel):
    deleted: int
    plans_deleted: int = Field(
        0, description="graph plan ranges built from the deleted bests, deleted with them (whole sets)"
    )
