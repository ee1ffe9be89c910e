from __future__ import annotations

import pytest
from verify_tuner import buckets


def test_bucket_below_256_and_two_per_octave():
    assert buckets.bucket_of(0) == buckets.Bucket(0, 0, 256)
    assert buckets.bucket_of(255).index == 0
    assert buckets.bucket_of(256) == buckets.Bucket(1, 256, 362)
    assert buckets.bucket_of(362).lo == 362
    b = buckets.bucket_of(46000)
    assert b.lo <= 46000 < b.hi and (b.lo, b.hi) == (32768, 46341)
    octave_edges = [e for e in buckets.EDGES if e and (e & (e - 1)) == 0]
    assert octave_edges[0] == 256 and (1 << 20) in octave_edges
    # between two powers of two there is exactly one more edge
    assert buckets.EDGES.index(1024) - buckets.EDGES.index(512) == 2


def test_buckets_tile_the_range_without_gaps():
    for a, b in zip(buckets.ALL, buckets.ALL[1:]):
        assert a.hi == b.lo and a.index + 1 == b.index
    for p in (0, 1, 255, 256, 1000, 46000, 131072, 1 << 20, buckets.MAX_PREFIX):
        b = buckets.bucket_of(p)
        assert b.lo <= p < b.hi


@pytest.mark.parametrize("bad", [-1, buckets.MAX_PREFIX + 1])
def test_out_of_range_prefix_is_rejected(bad):
    with pytest.raises(ValueError, match="prefix"):
        buckets.bucket_of(bad)


def test_log_distance_prefers_the_closer_octave():
    b = buckets.bucket_of(46000)
    assert buckets.log_distance(buckets.bucket_of(40000), b) < buckets.log_distance(buckets.bucket_of(4000), b)
    assert [x.index for x in buckets.buckets_between(1000, 5000)] == list(range(4, 10))


def test_batch_buckets_are_powers_of_two_ranges():
    from verify_tuner import batches

    assert [str(b) for b in batches.ALL[:9]] == ["1", "2", "3-4", "5-8", "9-16", "17-32", "33-64", "65-128", "129-256"]
    for a, b in zip(batches.ALL, batches.ALL[1:]):
        assert a.hi + 1 == b.lo and a.index + 1 == b.index
    for n in range(1, batches.MAX_BATCH + 1):
        bb = batches.bucket_of(n)
        assert bb.lo <= n <= bb.hi
    for bad in (0, -3, batches.MAX_BATCH + 1, 2.0, True):
        with pytest.raises(ValueError, match="batch"):
            batches.bucket_of(bad)


@pytest.mark.parametrize("statistic", ["mean", "max", "total"])
@pytest.mark.parametrize("spread", ["uniform", "one-long", "equal"])
def test_drawn_batches_have_the_centre_as_their_statistic(statistic, spread):
    from verify_tuner import batches

    for batch in (1, 2, 5, 32, 256):
        for centre in (0, 1, 300, 46000, 1 << 20):
            lens = batches.draw_prefixes(batch=batch, centre=centre, spread=spread, statistic=statistic)
            assert len(lens) == batch and min(lens) >= 0
            assert batches.prefix_of(lens, statistic) == centre
            assert lens == batches.draw_prefixes(batch=batch, centre=centre, spread=spread, statistic=statistic)
