"""Response models, separate from the tables."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, Field
from verify_tuner.store.lookup import Answer


class BucketOut(BaseModel):
    index: int
    lo: int = Field(description="inclusive")
    hi: int = Field(description="exclusive")


class BatchBucketOut(BaseModel):
    index: int
    lo: int = Field(description="inclusive")
    hi: int = Field(description="inclusive")


class ConfigOut(BaseModel):
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
    source: Literal["tuned", "nearest", "heuristic"]
    bucket: BucketOut
    batch_bucket: BatchBucketOut = Field(description="batch sizes this config serves; tuned rows never cross it")
    device: str
    kernel_hash: str
    expected_us: float | None
    speedup_vs_default: float | None
    tuned_at: dt.datetime | None
    tuned_bucket: int | None = Field(None, description="bucket the config was tuned on (nearest/tuned)")

    @classmethod
    def of(cls, a: Answer) -> ConfigOut:
        b, bb = a.bucket, a.batch_bucket
        return cls(
            **a.config.as_params(),
            source=a.source,
            bucket=BucketOut(index=b.index, lo=b.lo, hi=b.hi),
            batch_bucket=BatchBucketOut(index=bb.index, lo=bb.lo, hi=bb.hi),
            device=a.device,
            kernel_hash=a.kernel_hash,
            expected_us=a.expected_us,
            speedup_vs_default=a.speedup_vs_default,
            tuned_at=a.tuned_at,
            tuned_bucket=a.from_bucket,
        )


class ConfigTableOut(BaseModel):
    device: str
    kernel_hash: str
    dtype: str
    H: int
    q_len: int
    configs: list[ConfigOut]


class ImportOut(BaseModel):
    imported: int
    warnings: list[str] = Field(
        default_factory=list, description="rows stored but never served by this kernel (another kernel hash)"
    )


class DeleteOut(BaseModel):
    deleted: int
