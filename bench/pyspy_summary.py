"""Where a tuner process's threads spend their time, from py-spy's raw (collapsed-stack) output
of a table run: seconds of samples (summed over threads) inside chosen functions, for the tuner
processes only (the measuring child is left out), and the storage calls that waited most.

    WRAP="py-spy record --subprocesses --idle --nonblocking --rate 100 --format raw -o prof.txt --" \\
        MODES=multi bash bench/run_multi_table.sh OUT 0,1 20
    python bench/pyspy_summary.py prof_single.txt.gz prof_multi.txt.gz [--rate 100]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
from pathlib import Path

# Qualified names of the search loop on Optuna's ask/tell (verify_tuner.search.loop, .proposer,
# .ledger, .heartbeat) and of what it calls.
FUNCS = [
    "Loop.run",
    "Proposer.ask",
    "Proposer._feed",
    "TPESampler._sample",
    "Study.ask",
    "Study.tell",
    "TrialLog.flush",
    "Pipeline._build_then_measure",
    "IsolatedBackend.measure",
    "compile_cubin",
    "Condition.wait",
    "Proposer._unless_known",
    "DefaultDialect.do_execute",
    "DefaultDialect.do_commit",
    "pick_winner",
]
STORAGE = (
    "RDBStorage.",
    "_CachedStorage.",
    "Loop.",
    "Proposer.",
    "TrialLog.",
    "record_trial",
    "Ledger",
    "Heartbeat.",
    "Study.",
    "TPESampler",
    "_claim",
    "pick_winner",
    "_beating",
)


def _stacks(path: Path):  # type: ignore[no-untyped-def]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        for line in f:
            stack, n = line.rstrip("\n").rsplit(" ", 1)
            frames = [re.sub(r" \(.*", "", fr) for fr in stack.split(";")[1:]]
            if frames and "_child_main" not in frames:
                yield frames, int(n)


def summarise(path: Path, rate: float) -> tuple[dict[str, float], list[tuple[str, float]]]:
    incl: collections.Counter[str] = collections.Counter()
    waits: collections.Counter[str] = collections.Counter()
    for frames, n in _stacks(path):
        names = set(frames)
        for f in FUNCS:
            if f in names:
                incl[f] += n
        if "DefaultDialect.do_execute" in names or "DefaultDialect.do_commit" in names:
            callers = [f for f in frames if f.startswith(STORAGE) and "HeartbeatThread" not in f]
            waits[" > ".join(callers[-2:])] += n
    return {f: incl[f] / rate for f in FUNCS}, [(k, n / rate) for k, n in waits.most_common(8)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profiles", nargs="+", type=Path)
    ap.add_argument("--rate", type=float, default=100.0, help="py-spy's --rate (samples per second)")
    args = ap.parse_args()
    results = [(p.name, *summarise(p, args.rate)) for p in args.profiles]
    print("| function (seconds of thread samples) | " + " | ".join(r[0] for r in results) + " |")
    print("|---|" + "---|" * len(results))
    for f in FUNCS:
        print(f"| {f} | " + " | ".join(f"{r[1][f]:.1f}" for r in results) + " |")
    for name, _, waits in results:
        print(f"\n{name}: seconds inside SQLite calls, by caller")
        for k, s in waits:
            print(f"  {s:6.1f}  {k}")


if __name__ == "__main__":
    main()
