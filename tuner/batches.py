"""Batch-size buckets: 1, 2, 3-4, 5-8, ... (2^(k-1), 2^k] up to MAX_BATCH. This module alone
decides which bucket a batch falls in, how a bucket is measured, and which single prefix length
describes a ragged batch (BATCH_STATISTIC, chosen by measurement: docs/batching.md).

Why buckets of powers of two: the grid is B x H/HT x NSPLIT blocks, so the NSPLIT that fills one
wave halves each time B doubles; within a power-of-two range the best config barely moves
(bench/results/batch_*.md)."""

from __future__ import annotations

import random
from dataclasses import dataclass

#: Largest batch the service accepts (a step carrying more is bad input).
MAX_BATCH = 4096
#: How a ragged batch's prefixes become the one prefix its lookup uses (see prefix_of).
BATCH_STATISTIC = "max"
STATISTICS = ("mean", "max", "total")


@dataclass(frozen=True)
class BatchBucket:
    index: int
    lo: int  # inclusive
    hi: int  # inclusive: the batch a bucket is tuned at

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}-{self.hi}"


def _all() -> tuple[BatchBucket, ...]:
    out = [BatchBucket(0, 1, 1)]
    k = 1
    while (1 << k) <= MAX_BATCH:
        out.append(BatchBucket(k, (1 << (k - 1)) + 1, 1 << k))
        k += 1
    return tuple(out)


ALL = _all()


def bucket_of(batch: int) -> BatchBucket:
    if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch must be an integer in 1..{MAX_BATCH}, got {batch!r}")
    return ALL[(batch - 1).bit_length()]


def by_index(index: int) -> BatchBucket:
    if not 0 <= index < len(ALL):
        raise ValueError(f"batch bucket index must be in 0..{len(ALL) - 1}, got {index}")
    return ALL[index]


def prefix_of(prefix_lens: list[int], statistic: str = BATCH_STATISTIC) -> int:
    """The one prefix length that stands for a ragged batch in a lookup."""
    if not prefix_lens:
        raise ValueError("a batch holds at least one request")
    if statistic == "max":
        return max(prefix_lens)
    if statistic == "mean":
        return round(sum(prefix_lens) / len(prefix_lens))
    if statistic == "total":
        return sum(prefix_lens)
    raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")


#: Spreads a tuner measures ragged batches with. "uniform": each prefix uniform in 0.5x..1.5x of
#: the centre; "one-long": one request at the centre, the rest uniform in 0.1x..0.3x of it.
SPREADS = ("uniform", "one-long", "equal")


def draw_prefixes(
    *, batch: int, centre: int, spread: str = "uniform", seed: int = 0, statistic: str = BATCH_STATISTIC
) -> list[int]:
    """A reproducible ragged batch whose statistic (the lookup's prefix) equals `centre`, so a
    measurement made for a prefix bucket is one the lookup would serve from that bucket."""
    if spread not in SPREADS:
        raise ValueError(f"spread must be one of {SPREADS}, got {spread!r}")
    if batch < 1 or centre < 0:
        raise ValueError(f"need batch >= 1 and centre >= 0, got batch={batch}, centre={centre}")
    rng = random.Random(seed * 1_000_003 + batch * 7919 + centre)
    if spread == "equal" or batch == 1 or centre == 0:
        raw = [1.0] * batch
    elif spread == "uniform":
        raw = [rng.uniform(0.5, 1.5) for _ in range(batch)]
    else:
        raw = [1.0] + [rng.uniform(0.1, 0.3) for _ in range(batch - 1)]
    stat = {"max": max(raw), "mean": sum(raw) / batch, "total": sum(raw)}[statistic]
    out = [max(0, round(centre * x / stat)) for x in raw]
    # rounding may move the statistic by a token: put the difference on the first request
    out[0] = max(0, out[0] + centre - prefix_of(out, statistic))
    return out
