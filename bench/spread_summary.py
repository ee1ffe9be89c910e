"""Why the last partial blocks finish after the median: a summary of the per-block stamps that
`phase_trace.py --blocks` saves (each working partial block's id, SM and phase stamps).

Per traced case it prints when the blocks' tiles are done (median / p90 / max, microseconds from the
first block's start), their loops (Q + tile 0 landed -> tiles done: median / max), how strongly a
late finish follows a late start (Pearson correlation of tiles done with prologue issued), whether an
SM is slow (the loop's median per 16 SM ids: lowest-highest), how far an SM's two blocks finish
apart (median), when the blocks issue their prologue (p10 / p50 / p90 / max) and how long the step
from the plan to it takes by block id (the median per tenth of the ids, first half and second half
of them as ranges); for a build stamping when its index loads landed, that step split in two. The
numbers docs/ quote about the blocks' spread come from this command. A part
that walks several segments (a batch) restamps the segment loop's phases each segment, so for such
rows the figures mix its first and last segments: read them for B=1 traces.

    python3 bench/spread_summary.py bench/results/phase_trace_q1_fp8_e4m3_sm_90.json [FILE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

# indices into a block's stamps (phase_trace.PARTIAL)
PLAN, PROLOGUE, LANDED, DONE = 1, 2, 3, 4
# slot 7 of a build with this flag (a diagnostic of the sixth session, since removed from the kernel):
# the prologue's index loads have landed
INDICES, INDICES_FLAG = 7, "-DVA_TRACE_IDX"


def _deciles(vals: list[float]) -> list[float]:
    """p10 .. p90, interpolated between the closest ranks (numpy's default percentile)."""
    return statistics.quantiles(vals, n=10, method="inclusive")


def _range(vals: list[float]) -> str:
    return f"{min(vals):.2f}-{max(vals):.2f}"


def summarize(blocks: dict, indices: bool = False) -> dict | None:
    """The spread's figures for one traced case, or None when no block has finished a tile loop
    (every part empty, e.g. a prefix shorter than the grid's parts). `indices`: slot 7 holds when
    the prologue's index loads landed (INDICES_FLAG), split out of the step to the issued prologue."""
    rows = [(b, sm, us) for b, sm, us in zip(blocks["block"], blocks["sm"], blocks["us"], strict=True)
            if all(us[i] is not None for i in (PLAN, PROLOGUE, LANDED, DONE))]  # fmt: skip
    if len(rows) < 2:
        return None
    done = [us[DONE] for _, _, us in rows]
    loop = [us[DONE] - us[LANDED] for _, _, us in rows]
    issued = [us[PROLOGUE] for _, _, us in rows]
    by_sm: dict[int, list[int]] = {}
    for i, (_, sm, _) in enumerate(rows):
        by_sm.setdefault(sm, []).append(i)
    groups: dict[int, list[float]] = {}
    for sm, idx in by_sm.items():
        groups.setdefault(sm // 16, []).extend(loop[i] for i in idx)
    pairs = [abs(done[idx[0]] - done[idx[1]]) for idx in by_sm.values() if len(idx) == 2]
    top = max(b for b, _, _ in rows) + 1
    tenths: list[list[float]] = [[] for _ in range(10)]
    for b, _, us in rows:
        tenths[b * 10 // top].append(us[PROLOGUE] - us[PLAN])
    steps = [statistics.median(t) if t else None for t in tenths]
    extra = {}
    if indices and all(us[INDICES] is not None for _, _, us in rows):
        half = [b < top // 2 for b, _, _ in rows]
        wait = [us[INDICES] - us[PLAN] for _, _, us in rows]
        issue = [us[PROLOGUE] - us[INDICES] for _, _, us in rows]
        extra = {
            "plan to indices": (
                statistics.median(wait),
                statistics.median([w for w, h in zip(wait, half, strict=True) if h]),
                statistics.median([w for w, h in zip(wait, half, strict=True) if not h]),
            ),
            "indices to prologue issued": (statistics.median(issue), max(issue)),
        }
    return {
        **extra,
        "blocks": len(rows),
        "done": (statistics.median(done), _deciles(done)[8], max(done)),
        "loop": (statistics.median(loop), max(loop)),
        "corr": statistics.correlation(done, issued),
        "sm16 loop medians": [statistics.median(g) for g in groups.values()],
        "sm pair done apart": statistics.median(pairs) if pairs else None,
        "prologue issued": (*(_deciles(issued)[i] for i in (0, 4, 8)), max(issued)),
        "plan to prologue by tenth": steps,
    }


def render(case: str, kv: str, s: dict) -> str:
    steps = [v for v in s["plan to prologue by tenth"] if v is not None]
    first, second = s["plan to prologue by tenth"][:5], s["plan to prologue by tenth"][5:]
    halves = " / ".join(
        _range([v for v in h if v is not None]) for h in (first, second) if any(v is not None for v in h)
    )
    pair = s["sm pair done apart"]
    return (
        f"{kv} {case}: {s['blocks']} blocks; tiles done {' / '.join(f'{v:.2f}' for v in s['done'])}; "
        f"loop {s['loop'][0]:.2f} / {s['loop'][1]:.2f}; corr(done, prologue issued) {s['corr']:.2f}; "
        f"loop median per 16 SMs {_range(s['sm16 loop medians'])}; "
        f"an SM's two blocks done apart {'-' if pair is None else f'{pair:.2f}'}; "
        f"prologue issued {' / '.join(f'{v:.2f}' for v in s['prologue issued'])}; "
        f"plan -> prologue issued per tenth of ids {_range(steps)} (halves {halves})"
        + (
            f"; plan -> indices landed {s['plan to indices'][0]:.2f} (halves {s['plan to indices'][1]:.2f} / "
            f"{s['plan to indices'][2]:.2f}), -> prologue issued {s['indices to prologue issued'][0]:.2f} / "
            f"{s['indices to prologue issued'][1]:.2f}"
            if "plan to indices" in s
            else ""
        )
    )


def lines(doc: dict) -> list[str]:
    """One line per traced row that holds per-block stamps."""
    out = []
    for row in doc["rows"]:
        if "blocks" not in row:
            continue
        s = summarize(row["blocks"], INDICES_FLAG in row.get("flags", []))
        tag = f"{row['case']}" + ("" if row.get("variant", "default") == "default" else f" [{row['variant']}]")
        out.append(
            render(tag, row.get("kv_dtype", "bf16"), s)
            if s
            else f"{row.get('kv_dtype', 'bf16')} {tag}: no block finished a loop"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", type=Path, nargs="+", help="phase_trace result files written with --blocks")
    args = ap.parse_args()
    for f in args.files:
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError) as exc:
            sys.exit(f"spread_summary: {f}: {exc}")
        found = lines(doc)
        if not found:
            sys.exit(f"spread_summary: {f}: no row holds per-block stamps (trace it with phase_trace.py --blocks)")
        print(f"# {f.name} ({doc.get('device')}, {doc.get('date')})")
        print("\n".join(found))


if __name__ == "__main__":
    main()
