"""The runtime work plan: how the kernel's fixed grid of NSPLIT parts per head group shares a batch.

The partial and the reduce kernel compute this plan themselves on the device, from
`prefix_indptr` alone (csrc/verify_attention.cu, `Plan`), so a CUDA graph captured once follows
every batch it replays: nothing is prepared on the host and no buffer beyond the inputs changes.
This module is the same arithmetic in Python, for the CPU tests of its guarantees (every KV tile
owned by exactly one part, parts balanced, partial slots unique) and for sizing the workspace.

Request b costs `L_b` units plus, for every request but the first, `PLAN_C` units before them
(L_b = P_b + q_len virtual tokens; PLAN_C stands for the fixed cost of a segment a part adds by
starting a new request: the Q load, the pipeline's fill, the epilogue; a part's first segment is
paid by every part alike, so request 0 carries none). Part p of the N active parts takes units
[p*W/N, (p+1)*W/N) of the batch's W; a KV tile belongs to the part that holds its *first* token's
unit (a request's short last tile then costs its part a whole tile, as it does on the GPU).
N = min(NSPLIT, W // (PLAN_MIN_TILES * TK)): a part spans at least one tile, so every part between
a request's first and last holds some of its tiles and writes a partial. A batch of one request
takes N = min(NSPLIT, ceil(W / (PLAN_MIN_TILES * TK))) instead: its parts' windows then start on
its tiles' starts, one tile each while they are fewer than the grid's parts, and no part holds a
tile more than ceil(tiles / N) (the floor would leave one part two tiles at P=4096).

Short batches (`tiled`): when a batch of several requests has no more KV tiles than the grid has
parts (in a build without row splits, whose short batches split rows instead), the units above
would still leave most such batches a part of two tiles (windows a little wider than a tile hold
two tile starts now and then; 1 322 of 1 489 random batches of 2-16 requests at TK=32,
NSPLIT=132). Instead part p takes the batch's p-th tile (tiles numbered request by request):
N = the batch's tiles, one tile and one segment a part, which no plan can better, and the
partials stay as many as the tiles.

Row splits (a kernel built with -DVA_ROWSPLIT=3; the default build has none, ROW_SPLITS): when
the batch's tiles (W // TK; one request: rounded up) < NSPLIT * PLAN_SPLIT_TILES (with the
default 1: a batch too short for every part to get a tile; PLAN_MIN_TILES does not enter), the
grid's parts would idle; instead N
drops to at most NSPLIT // R and each part runs as R blocks, block r taking the n8 row tiles
row_split_tiles(r) of the block's rows over the part's tiles (R = row_splits: the kernel's
VA_ROWSPLIT, at most the row tiles). Slots and the reduce are those of the N parts: the row
splits write disjoint rows of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: Defaults of the kernel's PLAN_C (tokens of fixed cost a request adds) and PLAN_MIN_TILES.
PLAN_C = 128
PLAN_MIN_TILES = 1
#: The kernel's VA_ROWSPLIT default: the blocks a short batch's part is split into by rows (1:
#: none; -DVA_ROWSPLIT=3 builds split into 3), and PLAN_SPLIT_TILES: split while the batch has
#: fewer tiles than that many per grid part.
ROW_SPLITS = 1
PLAN_SPLIT_TILES = 1
#: The kernel's VA_TILED_PLAN default: short batches of several requests take one tile a part.
TILED_PLAN = True


def _row_split(*, rows: int, nsplit: int, splits: int) -> tuple[int, int]:
    """The kernel's (RSPLIT, RS): RS = ceil(NR / min(splits, NR)) n8 row tiles a split, and as many
    splits as such shares fill (4 tiles over 3 are 2 + 2, not 2 + 2 + 0)."""
    nr = -(-rows // 8)
    r0 = min(splits, nr) if nr > 1 and splits > 1 and nsplit >= splits else 1
    rs = -(-nr // r0)
    return -(-nr // rs), rs


def row_splits(*, rows: int, nsplit: int, splits: int = ROW_SPLITS) -> int:
    """The kernel's RSPLIT for a block of `rows` query rows: 1 when it cannot split (one n8 row
    tile, or fewer grid parts than splits)."""
    return _row_split(rows=rows, nsplit=nsplit, splits=splits)[0]


def row_split_tiles(*, rows: int, nsplit: int, r: int, splits: int = ROW_SPLITS) -> range:
    """The n8 row tiles that block r of a row-split part computes: the kernel's split_lo = r * RS and
    RS tiles from there, clipped to the block's NR (a last split may hold fewer, never none)."""
    nr = -(-rows // 8)
    rs = _row_split(rows=rows, nsplit=nsplit, splits=splits)[1]
    return range(min(r * rs, nr), min((r + 1) * rs, nr))


@dataclass(frozen=True)
class Segment:
    """Tiles [t0, t1] of request `request` that part `part` computes; `direct`: the part holds
    every tile of the request and writes its output itself; otherwise its partial goes to `slot`."""

    part: int
    request: int
    t0: int
    t1: int
    direct: bool

    @property
    def slot(self) -> int:
        return self.part + self.request


@dataclass(frozen=True)
class Plan:
    lengths: tuple[int, ...]  # L_b = P_b + q_len
    tk: int
    nsplit: int
    c: int = PLAN_C
    min_tiles: int = PLAN_MIN_TILES
    #: the kernel's RSPLIT (row_splits): 1, no row splits
    rsplit: int = 1
    split_tiles: int = PLAN_SPLIT_TILES
    #: the kernel's VA_TILED_PLAN (False: the unit plan alone, the A/B's other side)
    tiled_plan: bool = TILED_PLAN

    @property
    def tiled(self) -> bool:
        """Whether part p takes the batch's p-th tile (a short batch of several requests, above)."""
        return (
            self.tiled_plan
            and len(self.lengths) > 1
            and self.rsplit == 1
            and self.tiles_before(len(self.lengths)) <= self.nsplit
        )

    def tiles_before(self, b: int) -> int:
        """The tiles of requests 0..b-1: request b's first part in a tiled plan."""
        return sum(self.tiles(j) for j in range(b))

    def unit(self, b: int) -> int:
        """U(b): units before request b (whose fixed cost, then tokens, follow)."""
        return sum(self.lengths[:b]) + max(b - 1, 0) * self.c

    def overhead(self, b: int) -> int:
        """Units of fixed cost at the start of request b: none for the first."""
        return self.c if b > 0 else 0

    def tile_unit(self, b: int, t: int) -> int:
        """The unit of tile t's first token in request b (what decides its part)."""
        return self.unit(b) + self.overhead(b) + t * self.tk

    @property
    def total(self) -> int:
        return self.unit(len(self.lengths))

    @property
    def parts(self) -> int:
        """N, the parts that get work."""
        if self.tiled:
            return self.tiles_before(len(self.lengths))
        n = max(1, min(self.nsplit, self._spans(self.min_tiles * self.tk)))
        return max(1, min(n, self.nsplit // self.rsplit)) if self.split else n

    @property
    def split(self) -> bool:
        """Whether the parts run as row splits: without them some grid parts would idle."""
        return self.rsplit > 1 and self._spans(self.tk) < self.nsplit * self.split_tiles

    def _spans(self, step: int) -> int:
        """The batch's units in spans of `step`: rounded up for one request (its windows then
        start on its tiles' starts), down for several (every part spans a whole step)."""
        return -(-self.total // step) if len(self.lengths) == 1 else self.total // step

    @property
    def blocks_per_part(self) -> int:
        """R: the grid parts each part's tiles run on (row splits), 1 without a split."""
        return self.rsplit if self.split else 1

    def part_begin(self, p: int) -> int:
        return p * self.total // self.parts

    def part_of(self, u: int) -> int:
        return ((u + 1) * self.parts - 1) // self.total

    def tiles(self, b: int) -> int:
        return -(-self.lengths[b] // self.tk)

    def segment(self, p: int, b: int) -> Segment | None:
        """Part p's tiles of request b, or None (the kernel's Plan::segment)."""
        if self.tiled:
            t = p - self.tiles_before(b)
            if not 0 <= t < self.tiles(b):
                return None
            return Segment(part=p, request=b, t0=t, t1=t, direct=self.tiles(b) == 1)
        start, nt = self.tile_unit(b, 0), self.tiles(b)
        x = self.part_begin(p) - start
        y = self.part_begin(p + 1) - start
        t0 = 0 if x <= 0 else -(-x // self.tk)
        t1 = -1 if y <= 0 else min(nt - 1, -(-y // self.tk) - 1)
        if t0 > t1:
            return None
        return Segment(part=p, request=b, t0=t0, t1=t1, direct=t0 == 0 and t1 == nt - 1)

    def request_parts(self, b: int) -> range:
        """The parts holding request b's tiles, first to last (what the reduce merges)."""
        if self.tiled:
            return range(self.tiles_before(b), self.tiles_before(b) + self.tiles(b))
        first = self.part_of(self.tile_unit(b, 0))
        return range(first, self.part_of(self.tile_unit(b, self.tiles(b) - 1)) + 1)

    def segments(self) -> list[Segment]:
        """Every part's segments, in the order the kernel's blocks walk them."""
        out = []
        if self.tiled:
            return [s for p in range(self.parts) for b in range(len(self.lengths)) if (s := self.segment(p, b))]
        for p in range(self.parts):
            b = next(b for b in range(len(self.lengths)) if self.unit(b) <= self.part_begin(p) < self.unit(b + 1))
            while b < len(self.lengths) and self.unit(b) < self.part_begin(p + 1):
                seg = self.segment(p, b)
                if seg is not None:
                    out.append(seg)
                b += 1
        return out


def plan(
    prefix_lens: Sequence[int],
    *,
    q_len: int,
    tk: int,
    nsplit: int,
    c: int = PLAN_C,
    min_tiles: int = PLAN_MIN_TILES,
    rsplit: int = 1,
    split_tiles: int = PLAN_SPLIT_TILES,
    tiled_plan: bool = TILED_PLAN,
) -> Plan:
    if not prefix_lens:
        raise ValueError("a batch holds at least one request")
    lengths = tuple(p + q_len for p in prefix_lens)
    return Plan(
        lengths, tk=tk, nsplit=nsplit, c=c, min_tiles=min_tiles, rsplit=rsplit, split_tiles=split_tiles,
        tiled_plan=tiled_plan,
    )  # fmt: skip


def workspace_slots(*, nsplit: int, batch: int) -> int:
    """Partial slots a batch can need: part p's partial of request b lives in slot p + b."""
    return nsplit + batch - 1
