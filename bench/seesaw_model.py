"""The seesaw's (PIPE 3) hand-offs as a model, run under random interleavings of its two warp
groups: no deadlock, no named barrier whose arrivals come from two different tiles, and every read
of a ring slot, a P or alpha buffer or a rescale flag sees the tile it is meant for. A change to the
order of the loop in verify_attention.cu is checked here before it runs on a GPU, where a wrong
barrier id hangs the device until the call's limit.

    python3 bench/seesaw_model.py [--tiles 9] [--runs 2000]

Each group is one actor (its own barrier, BAR_GROUP, orders it internally); a named barrier
completes when both groups have reached it (one arrives, the other syncs). Every order runs with
both of the kernel's prologues: all tiles at once (the default) and its later tiles deferred until
Q has landed (VA_DEFER_PRO=1).
"""

from __future__ import annotations

import argparse
import random
import sys

#: The orders of a group's turn at tile t (u = t - 1, the other group's tile): the kernel's
#: ("refill_first": PV(u), the slot's release and refill, then the softmax), the release and refill
#: after the softmax ("softmax_first": correct, measured slower at ff375b0,
#: bench/results/ab_kernel_flags_sm_90.md), the softmax right after P(u)'s hand-off ("p_early": P,
#: alpha and the flags in three buffers, the owner resetting its tile's flag at the start of its
#: turn; correct, measured slower and removed, git has it: 5244f0a, the same file), and a control
#: the model must reject ("early": that order on P's two buffers and two flags, which the other
#: group may still read).
ORDERS = ("refill_first", "softmax_first", "p_early")
CONTROL = "early"
#: The seesaw's ring (odd: the owner of t refills slot t-1 with tile t+STAGES-1, its own); five slots
#: passed the model too and measured slower (bench/results/ab_kernel_flags_sm_90.md)
STAGES = (3,)


def turn_ops(t: int, ntiles: int, stages: int, order: str) -> list[tuple]:
    """One group's operations at its turn t (t == ntiles: the closing turn that only finishes u)."""
    if order == "p_early":
        return _p_early_ops(t, ntiles, stages)
    own, u, ops = t < ntiles, t - 1, []
    if own:  # tile t landed: the group's later cp.async groups may stay pending
        ops += [("wait", (stages - 1) // 2 - (t > 0), t), ("landed", t, t), ("read", f"slot{t % stages}", t)]  # QK(t)
    pv_u = [("read", f"P{u & 1}", u), ("read", f"alpha{u & 1}", u), ("read", f"flag{u & 1}", u)]
    pv_u.append(("read", f"slot{u % stages}", u))
    if t >= 1:
        ops.append(("sync", f"P{u & 1}", u))
        if order != CONTROL or not own:
            ops += pv_u
        if order == "refill_first" or not own:
            ops.append(("sync", f"EMPTY{u % stages}", u))
            if own:
                ops.append(("refill", f"slot{(t + stages - 1) % stages}", t + stages - 1))
    if own:
        ops += [("read", "ml", t - 1), ("write", "ml", t)]  # softmax(t) after softmax(t-1)
        ops += [("write", f"P{t & 1}", t), ("write", f"alpha{t & 1}", t), ("write", f"flag{t & 1}", t)]
        ops.append(("write", f"flag{(t + 1) & 1}", -1))  # the next tile's flag reset
        ops.append(("read", f"flag{t & 1}", t))  # read before the arrive
        ops.append(("arrive", f"P{t & 1}", t))
        if order == CONTROL and t >= 1:
            ops += pv_u
        if order != "refill_first" and t >= 1:
            ops.append(("sync", f"EMPTY{u % stages}", u))
            ops.append(("refill", f"slot{(t + stages - 1) % stages}", t + stages - 1))
        ops += [("read", f"P{t & 1}", t), ("read", f"alpha{t & 1}", t), ("read", f"slot{t % stages}", t)]  # PV(t)
        ops.append(("arrive", f"EMPTY{t % stages}", t))
    return ops


def _p_early_ops(t: int, ntiles: int, stages: int) -> list[tuple]:
    """p_early's turn (5244f0a's VA_P_EARLY): reset tile t's flag (buffer t % 3); QK(t); P(u)'s
    hand-off; softmax(t) into buffer t % 3 and P(t)'s hand-off; PV(u), the release and the refill;
    PV(t)."""
    own, u, ops = t < ntiles, t - 1, []
    if own:
        ops.append(("write", f"flag{t % 3}", -1))
        ops += [("wait", (stages - 1) // 2 - (t > 0), t), ("landed", t, t), ("read", f"slot{t % stages}", t)]
    if t >= 1:
        ops.append(("sync", f"P{u & 1}", u))
    if own:
        ops += [("read", "ml", t - 1), ("write", "ml", t)]
        ops += [("write", f"P{t % 3}", t), ("write", f"alpha{t % 3}", t), ("write", f"flag{t % 3}", t)]
        ops.append(("arrive", f"P{t & 1}", t))
    if t >= 1:
        ops += [("read", f"{b}{u % 3}", u) for b in ("P", "alpha", "flag")] + [("read", f"slot{u % stages}", u)]
        ops.append(("sync", f"EMPTY{u % stages}", u))
        if own:
            ops.append(("refill", f"slot{(t + stages - 1) % stages}", t + stages - 1))
    if own:
        ops += [("read", f"{b}{t % 3}", t) for b in ("P", "alpha", "flag")] + [("read", f"slot{t % stages}", t)]
        ops.append(("arrive", f"EMPTY{t % stages}", t))
    return ops


def prologue(grp: int, stages: int, deferred: bool) -> list[tuple]:
    """A group's prologue: Q, then its tiles of the first STAGES, each one cp.async group; deferred
    (the kernel's VA_DEFER_PRO=1, off by default), tiles past 0 are an empty group at first and are
    loaded, each a group of its own, once Q has landed, then the block's barrier."""
    mine = range(grp, stages, 2)
    ops = [("commit", "Q", -1)]
    ops += [("refill", f"slot{s}", s) if s == 0 or not deferred else ("commit", "empty", -1) for s in mine]
    ops += [("wait", (stages + 1) // 2 if grp == 0 else (stages - 1) // 2, -1), ("landed", "Q", -1)]
    if deferred:
        ops += [("refill", f"slot{s}", s) for s in mine if s != 0] + [("sync", "BLOCK", -1)]
    return ops


def program(grp: int, ntiles: int, stages: int, order: str, deferred: bool = False) -> list[tuple]:
    """A group's prologue and turns."""
    ops = prologue(grp, stages, deferred and ntiles > 1)  # the kernel defers nothing for a one-tile part
    for t in range(grp, ntiles + 1, 2):
        ops += turn_ops(t, ntiles, stages, order)
    return ops


def run(ntiles: int, stages: int, order: str, rng: random.Random, deferred: bool = False) -> str | None:
    """One random interleaving; the first violation found, or None."""
    progs = [program(g, ntiles, stages, order, deferred) for g in (0, 1)]
    pc = [0, 0]
    waiting: dict[int, tuple] = {}  # group -> (barrier, generation) it syncs on
    bars: dict[str, list] = {}  # barrier -> [generation, arrivals [(group, tile)]]
    done_gen: dict[tuple, bool] = {}
    content: dict[str, int] = {"ml": -1, **{f"flag{i}": -1 for i in (0, 1, 2)}}
    commits: list[list] = [[], []]  # each group's cp.async groups in order (a refill past the end: an empty one)
    landed: list[set] = [set(), set()]
    while pc[0] < len(progs[0]) or pc[1] < len(progs[1]):
        ready = [g for g in (0, 1) if pc[g] < len(progs[g]) and (g not in waiting or done_gen.get(waiting[g]))]
        if not ready:
            return f"deadlock at group 0 op {pc[0]}, group 1 op {pc[1]}"
        g = rng.choice(ready)
        if g in waiting:
            del waiting[g]
            pc[g] += 1
            continue
        kind, res, tile = progs[g][pc[g]]
        if kind in ("arrive", "sync"):
            gen, arrivals = bars.setdefault(res, [0, []])
            arrivals.append((g, tile))
            if len({a[1] for a in arrivals}) > 1 or len({a[0] for a in arrivals}) < len(arrivals):
                return f"barrier {res} generation {gen} mixes {arrivals}"
            key = (res, gen)
            if len(arrivals) == 2:
                done_gen[key] = True
                bars[res] = [gen + 1, []]
            if kind == "sync" and not done_gen.get(key):
                waiting[g] = key
                continue
        elif kind == "write":
            content[res] = tile
        elif kind in ("refill", "commit"):
            if kind == "refill" and tile < ntiles:
                content[res] = tile
            commits[g].append(tile if kind == "refill" else res)
        elif kind == "wait":  # cp.async.wait_group N: all but the newest N groups have landed
            landed[g].update(commits[g][: len(commits[g]) - res] if res else commits[g])
        elif kind == "landed" and res not in landed[g]:
            return f"group {g} uses {res} before its cp.async group landed"
        elif kind == "read" and content.get(res) != tile and not (res == "ml" and tile < 0):
            return f"group {g} reads {res} for tile {tile} but it holds tile {content.get(res)}"
        pc[g] += 1
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", type=int, default=9, help="tiles of one split (each count up to it is run)")
    ap.add_argument("--runs", type=int, default=2000, help="random interleavings per case")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng, failed = random.Random(args.seed), False
    for stages in STAGES:
        for order in (*ORDERS, CONTROL):
            bad = next(
                (
                    f"{n} tiles, {'deferred' if deferred else 'whole'} prologue: {why}"
                    for deferred in (False, True)
                    for n in range(1, args.tiles + 1)
                    for _ in range(args.runs)
                    if (why := run(n, stages, order, rng, deferred))
                ),
                None,
            )
            control = order == CONTROL
            print(f"STAGES={stages} {order:14s} {'(control, must fail) ' if control else ''}{bad or 'ok'}")
            failed |= (bad is None) if control else (bad is not None)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
