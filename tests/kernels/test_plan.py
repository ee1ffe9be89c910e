"""The runtime work plan's guarantees (verify_tuner.kernels.plan, the kernel's Plan in Python):
every KV tile computed by exactly one part, parts balanced within one tile, every part the
reduce merges holds a partial, partial slots unique and inside the workspace."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from verify_tuner.kernels.plan import PLAN_C, ROW_SPLITS, plan, row_split_tiles, row_splits, workspace_slots

EXTREMES = {
    "one 200k and 31 empty": [200_000] + [0] * 31,
    "all empty": [0] * 8,
    "B=256 of 1k": [1000] * 256,
    "one long among short": [100_000] + [2000] * 7,
    "B=1 short": [0],
    "B=1 46k": [46000],
}


def _check(prefix_lens: list[int], q_len: int, tk: int, nsplit: int, rsplit: int = 1, split_tiles: int = 1) -> None:
    p = plan(prefix_lens, q_len=q_len, tk=tk, nsplit=nsplit, rsplit=rsplit, split_tiles=split_tiles)
    segs = p.segments()
    # every tile of every request exactly once, in order
    owned: dict[int, list[int]] = {}
    for s in segs:
        owned.setdefault(s.request, []).extend(range(s.t0, s.t1 + 1))
    for b in range(len(prefix_lens)):
        assert owned.get(b) == list(range(p.tiles(b))), (b, owned.get(b))
    # the parts the reduce merges are exactly the parts holding the request's tiles
    for b in range(len(prefix_lens)):
        holders = sorted({s.part for s in segs if s.request == b})
        assert holders == list(p.request_parts(b))
        direct = [s.direct for s in segs if s.request == b]
        assert direct == [len(holders) == 1] * len(holders)
    # slots: unique among partials, inside the workspace
    slots = [s.slot for s in segs if not s.direct]
    assert len(slots) == len(set(slots))
    assert all(0 <= s < workspace_slots(nsplit=nsplit, batch=len(prefix_lens)) for s in slots)
    # balance: a part computes at most its share of the units plus one tile
    share = -(-p.total // p.parts)
    for part in range(p.parts):
        tokens = sum(min((s.t1 + 1) * tk, p.lengths[s.request]) - s.t0 * tk for s in segs if s.part == part)
        assert tokens <= share + tk, (part, tokens, share)
    assert 1 <= p.parts * p.blocks_per_part <= nsplit  # the grid holds every block


@pytest.mark.parametrize("case", EXTREMES, ids=list(EXTREMES))
@pytest.mark.parametrize("nsplit", [1, 8, 132, 264])
@pytest.mark.parametrize("tk", [16, 32, 64])
@pytest.mark.parametrize("rows", [8, 72])
def test_extremes(case, nsplit, tk, rows):
    for ways in (1, 3):  # the default build and -DVA_ROWSPLIT=3
        _check(EXTREMES[case], q_len=9, tk=tk, nsplit=nsplit, rsplit=row_splits(rows=rows, nsplit=nsplit, splits=ways))


@settings(max_examples=300, deadline=None)
@given(
    prefix_lens=st.lists(st.integers(0, 20_000), min_size=1, max_size=40),
    q_len=st.integers(1, 64),
    tk=st.sampled_from([16, 32, 64, 128]),
    nsplit=st.integers(1, 300),
)
def test_random_batches(prefix_lens, q_len, tk, nsplit):
    _check(prefix_lens, q_len, tk, nsplit)
    split3 = row_splits(rows=72, nsplit=nsplit, splits=3)  # as built with -DVA_ROWSPLIT=3
    _check(prefix_lens, q_len, tk, nsplit, rsplit=split3)
    _check(prefix_lens, q_len, tk, nsplit, rsplit=split3, split_tiles=3)


@pytest.mark.parametrize("rows", [8, 9, 16, 24, 32, 33, 40, 64, 72, 128])
@pytest.mark.parametrize("nsplit", [1, 2, 3, 132])
@pytest.mark.parametrize("ways", [ROW_SPLITS, 3])  # the default build (none) and -DVA_ROWSPLIT=3
def test_row_splits_cover_every_row_tile_once(rows, nsplit, ways):
    R = row_splits(rows=rows, nsplit=nsplit, splits=ways)
    splits = [row_split_tiles(rows=rows, nsplit=nsplit, r=r, splits=ways) for r in range(R)]
    assert [t for tiles in splits for t in tiles] == list(range(-(-rows // 8)))
    # no block of a part idles: every split holds a tile (a last one may hold fewer: 6 + 6 + 4)
    assert all(splits)
    nr = -(-rows // 8)
    assert R <= nsplit and (R > 1) == (nr > 1 and ways > 1 and nsplit >= ways)
    # the kernel's shares: RS = ceil(NR / min(ways, NR)) tiles, as many as they fill
    rs = -(-nr // min(ways, nr)) if R > 1 else nr
    assert len(splits[0]) == rs and R == -(-nr // rs)


def test_the_default_build_has_no_row_splits():
    assert ROW_SPLITS == 1 and row_splits(rows=72, nsplit=132) == 1
    assert not plan([0], q_len=9, tk=32, nsplit=132, rsplit=row_splits(rows=72, nsplit=132)).split


def test_four_row_tiles_split_two_ways_not_three():
    # 32 rows (H=8 q=4 at HT=8) built with 3-way splits: 2 + 2 tiles over two blocks, so a part takes
    # 2 grid slots, not 3
    assert row_splits(rows=32, nsplit=132, splits=3) == 2
    assert [list(row_split_tiles(rows=32, nsplit=132, r=r, splits=3)) for r in range(2)] == [[0, 1], [2, 3]]


def test_a_short_request_runs_as_row_splits_over_fewer_parts():
    # B=1 P=1000, 72 rows: 32 parts of one tile would leave 100 of 132 grid parts idle; as row
    # splits, 32 parts x 3 blocks of 24 rows (96 blocks); a long prefix keeps every part whole
    short = plan([1000], q_len=9, tk=32, nsplit=132, rsplit=3)
    assert short.split and short.parts == 32 and short.blocks_per_part == 3
    fewer = plan([3000], q_len=9, tk=32, nsplit=132, rsplit=3)
    assert fewer.split and fewer.parts == 44  # 95 tiles: 44 parts of 2-3 tiles
    assert plan([4096], q_len=9, tk=32, nsplit=132, rsplit=3).split  # 129 tiles for 132 parts
    assert not plan([4200], q_len=9, tk=32, nsplit=132, rsplit=3).split  # 132 tiles: one a part
    assert plan([4200], q_len=9, tk=32, nsplit=132, rsplit=3, split_tiles=2).parts == 44
    # parts of two tiles at P=4200 (both seesaw groups with a tile) stay whole: the batch has a tile a part
    two = plan([4200], q_len=9, tk=32, nsplit=132, rsplit=3, min_tiles=2)
    assert not two.split and two.parts == 66
    long = plan([46000], q_len=9, tk=32, nsplit=132, rsplit=3)
    assert not long.split and long.parts == 132 and long.blocks_per_part == 1


def test_one_long_request_among_short_ones_is_shared_evenly():
    """The ragged case a uniform split gets wrong: the long request's parts carry the same load
    as the parts that take many short requests."""
    p = plan([100_000] + [2000] * 7, q_len=9, tk=32, nsplit=132)
    loads = [0] * p.parts
    for s in p.segments():
        loads[s.part] += min((s.t1 + 1) * 32, p.lengths[s.request]) - s.t0 * 32
    assert max(loads) <= 1.1 * sum(loads) / p.parts + 32


def test_a_short_batch_leaves_parts_idle_and_writes_directly():
    p = plan([0], q_len=9, tk=32, nsplit=132)
    (seg,) = p.segments()  # one part holds the one tile
    assert seg.direct and (seg.t0, seg.t1) == (0, 0) and p.parts == 1


@pytest.mark.parametrize(("tk", "nsplit", "q_len"), [(32, 132, 9), (16, 94, 9), (64, 188, 1), (32, 16, 64)])
def test_one_request_gives_no_part_more_than_its_ceiling_share(tk, nsplit, q_len):
    """B=1, the latency case: the slowest part holds ceil(tiles / parts) tiles and every part one
    at least. Counting a short last tile by its tokens, or charging the first request a fixed cost,
    left one part of 132 two tiles at P=4096 (and twelve at 46000, where eleven is the share)."""
    for prefix in [*range(0, 9000, 7), 46000, 131072, 200_000]:
        p = plan([prefix], q_len=q_len, tk=tk, nsplit=nsplit)
        tiles = p.tiles(0)
        assert p.parts == min(nsplit, tiles), prefix
        held = [0] * p.parts
        for s in p.segments():
            held[s.part] += s.t1 - s.t0 + 1
        assert max(held) == -(-tiles // p.parts) and min(held) >= 1, (prefix, max(held), min(held))


def test_a_second_request_pays_the_fixed_cost():
    """PLAN_C units precede every request after the first: a part that starts a new request
    carries its fixed cost as tokens it does not compute."""
    p = plan([3000, 3000], q_len=9, tk=32, nsplit=132)  # 190 tiles: more than the grid's parts
    assert not p.tiled
    assert p.unit(1) == 3009 and p.tile_unit(1, 0) == 3009 + PLAN_C and p.total == 2 * 3009 + PLAN_C


@pytest.mark.parametrize(("tk", "nsplit", "q_len"), [(32, 132, 9), (16, 94, 9), (64, 188, 1), (32, 16, 64)])
def test_a_short_batch_gives_every_part_one_tile(tk, nsplit, q_len):
    """Several requests whose tiles fit the grid: one tile and one segment a part. The unit plan
    gave a part two tiles in most such batches (P=1000 at B=3 and 4: 2 where 1 is the share)."""
    checked = 0
    for batch in range(2, 33):
        for prefix in range(0, 6000, 37):
            lens = [(prefix * (k + 3)) // (batch + 2) for k in range(batch)]  # ragged, growing
            p = plan(lens, q_len=q_len, tk=tk, nsplit=nsplit)
            tiles = sum(p.tiles(b) for b in range(batch))
            if tiles > nsplit:
                assert not p.tiled
                continue
            checked += 1
            assert p.tiled and p.parts == tiles
            segs = p.segments()
            assert [s.part for s in segs] == list(range(tiles)), lens  # every part one segment
            assert all(s.t0 == s.t1 for s in segs)
            _check(lens, q_len, tk, nsplit)
    assert checked >= 15  # (NSPLIT=16 at q_len 64 fits few batches)


def test_the_unit_plan_doubled_a_short_batchs_tile_where_the_tiled_one_does_not():
    """What the tiled plan is for, at the batch the issue names: three requests of P=1000."""
    p = plan([1000] * 3, q_len=9, tk=32, nsplit=132)
    assert p.tiled and p.parts == 96 and len(p.segments()) == 96
    unit = plan([1000] * 3, q_len=9, tk=32, nsplit=132, tiled_plan=False)  # -DVA_TILED_PLAN=0
    assert not unit.tiled
    _check([1000] * 3, 9, 32, 132)
    held: dict[int, int] = {}
    for s in unit.segments():
        held[s.part] = held.get(s.part, 0) + s.t1 - s.t0 + 1
    assert max(held.values()) == 2


def test_one_request_or_a_row_split_build_takes_no_tiled_plan():
    assert not plan([1000], q_len=9, tk=32, nsplit=132).tiled  # B=1: the unit plan is already one a part
    assert not plan([100, 100], q_len=9, tk=32, nsplit=132, rsplit=3).tiled  # the row splits decide there
