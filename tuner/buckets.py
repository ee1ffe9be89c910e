"""Prefix-length buckets: one below 256, then two per octave from 256 up to 2^20, then one open
bucket up to MAX_PREFIX. This module alone decides which bucket a prefix falls in."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

MIN_EDGE = 256
MAX_EDGE = 1 << 20
#: Longest prefix the service accepts; anything longer is treated as bad input.
MAX_PREFIX = 1 << 24


def _edges() -> tuple[int, ...]:
    octaves = int(math.log2(MAX_EDGE // MIN_EDGE))
    return (0,) + tuple(round(MIN_EDGE * 2 ** (k / 2)) for k in range(2 * octaves + 1)) + (MAX_PREFIX + 1,)


EDGES = _edges()


@dataclass(frozen=True)
class Bucket:
    index: int
    lo: int  # inclusive
    hi: int  # exclusive

    @property
    def mid(self) -> int:
        """A representative prefix: the geometric middle (the arithmetic one for bucket 0)."""
        if self.lo == 0:
            return self.hi // 2
        return round(math.sqrt(self.lo * self.hi))


ALL = tuple(Bucket(i, EDGES[i], EDGES[i + 1]) for i in range(len(EDGES) - 1))


def bucket_of(prefix: int) -> Bucket:
    if not 0 <= prefix <= MAX_PREFIX:
        raise ValueError(f"prefix must be in 0..{MAX_PREFIX}, got {prefix}")
    return ALL[bisect.bisect_right(EDGES, prefix) - 1]


def by_index(index: int) -> Bucket:
    if not 0 <= index < len(ALL):
        raise ValueError(f"bucket index must be in 0..{len(ALL) - 1}, got {index}")
    return ALL[index]


def log_distance(a: Bucket, b: Bucket) -> float:
    return abs(math.log2(max(a.mid, 1)) - math.log2(max(b.mid, 1)))


def buckets_between(lo: int, hi: int) -> list[Bucket]:
    """Every bucket that holds some prefix in [lo, hi]."""
    return list(ALL[bucket_of(lo).index : bucket_of(hi).index + 1])
