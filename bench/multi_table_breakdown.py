"""Where a table's wall time goes, one GPU against several (issue 15), from the JSON and log that
bench/run_multi_table.sh leaves per mode: the start (before the first trial), when the first trial
ended (it waits for the measuring child's start, bench/measurer_start.py), each process's keys
(first trial start to last trial end, from the study's timestamps), the wait of the process that
finished first for the last key, and the end (the last winner's re-timing, exit).

    python bench/multi_table_breakdown.py bench/results/multi_table/trials60_1 [more prefixes]

A prefix names `<prefix>_table_single.json` and `<prefix>_table_multi.json`; the multi run's
`<prefix>_table_multi.log` says which GPU owned each key, and without it (bench/results keeps no
raw logs) the wait of the process done first is shown as '-'. `<prefix>@<other prefix>` takes the
one-GPU run from the other prefix (an A/B call ran one single-GPU run against two codes' multi-GPU
runs).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path


def _owners(log: Path) -> dict[str, str] | None:
    """bucket ('b6') -> the GPU whose process owned it, from the multi run's log; None without it."""
    if not log.exists():
        return None
    out = {}
    for line in log.read_text().splitlines():
        if m := re.match(r"GPU (\d+): .*\|(b\d+) prefix=", line):
            out[m.group(2)] = m.group(1)
    return out


def breakdown(spec: str) -> dict:
    prefix, _, single_prefix = spec.partition("@")
    runs = {}
    for mode in ("single", "multi"):
        prefix_of = single_prefix if mode == "single" and single_prefix else prefix
        d = json.loads(Path(f"{prefix_of}_table_{mode}.json").read_text())
        keys = {k["study"].rsplit("|", 1)[1]: k for k in d["per_key"]}
        spans = {b: k["span_s"][1] - k["span_s"][0] for b, k in keys.items()}
        owners = _owners(Path(f"{prefix}_table_{mode}.log")) if mode == "multi" else dict.fromkeys(keys, "0")
        finish: dict[str, float] = {}
        for b, k in keys.items():
            g = owners.get(b, "?") if owners is not None else "?"
            finish[g] = max(finish.get(g, 0.0), k["span_s"][1])
        tl = d["timeline"]
        later = [b for b in spans if b not in ("b6", "b7")]  # the first keys also pay the cold compile cache
        runs[mode] = {
            "wall_s": d["wall_s"],
            "start_s": tl["first_trial_start_s"],
            "first_end_s": tl["first_trial_end_s"],
            "end_s": round(d["wall_s"] - tl["last_trial_end_s"], 2),
            "keys_summed_s": round(sum(spans.values()), 1),
            "s_per_later_key": round(statistics.mean(spans[b] for b in later), 2),
            "trials_per_later_key": round(statistics.mean(keys[b]["trials"] for b in later)),
            "configs": d.get("configs_measured"),  # distinct configs the table measured (JSON from session 11 on)
            "first_done_waits_s": None if owners is None else round(max(finish.values()) - min(finish.values()), 1),
        }
    runs["ratio"] = round(runs["single"]["wall_s"] / runs["multi"]["wall_s"], 2)
    return runs


def _seconds(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("prefixes", nargs="+")
    args = ap.parse_args()
    print(
        "| run | 1 GPU wall | 2 GPUs wall | ratio | start 1 / 2 | first trial ends 1 / 2 | "
        "s per later key 1 / 2 (trials a key) | keys summed 1 / 2 | configs measured 1 / 2 | "
        "last keys end apart (the first done helps or waits) | end 1 / 2 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in args.prefixes:
        r = breakdown(p)
        s, m = r["single"], r["multi"]
        print(
            f"| {Path(p).name} | {s['wall_s']:.1f} s | {m['wall_s']:.1f} s | {r['ratio']:.2f}x | "
            f"{s['start_s']:.1f} / {m['start_s']:.1f} s | {s['first_end_s']:.1f} / {m['first_end_s']:.1f} s | "
            f"{s['s_per_later_key']:.2f} ({s['trials_per_later_key']}) / "
            f"{m['s_per_later_key']:.2f} ({m['trials_per_later_key']}) s | {s['keys_summed_s']:.1f} / "
            f"{m['keys_summed_s']:.1f} s | {s['configs'] or '-'} / {m['configs'] or '-'} | "
            f"{_seconds(m['first_done_waits_s'])} | {s['end_s']:.1f} / {m['end_s']:.1f} s |"
        )


if __name__ == "__main__":
    main()
