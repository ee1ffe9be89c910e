"""What `tuner study start` prints: the progress line of the key being tuned, the summary table
of the keys done, and how long it waited for keys other processes owned."""

from __future__ import annotations

import sys
from typing import Any

from verify_tuner.keys import format_label as fmt


class Bar:
    """One self-rewriting status line on stderr (a plain line per update when not a TTY)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    def __call__(self, p: Any) -> None:
        best = f"{p.best_us:.1f} us" if p.best_us else "-"
        sp = f" ({p.default_us / p.best_us:.2f}x vs default)" if p.best_us and p.default_us else ""
        width = 24
        done = int(width * min(p.measured, p.budget) / max(p.budget, 1))
        line = (
            f"H={p.key.H} q={p.key.q_len}{fmt(p.key)} b{p.key.bucket} B{p.key.batch_bucket} "
            f"[{'#' * done}{'.' * (width - done)}] "
            f"{p.measured}/{p.budget}  best {best}{sp}"
        )
        if self.tty:
            sys.stderr.write("\r" + line[:150].ljust(150))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def end(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def waited(idle: dict[str, Any]) -> str:
    """What verify_tuner.jobs.runner.idle reports, as a phrase."""
    declined = ", ".join(
        f"prefix={d['prefix']} batch={d['batch']} with {d['places_left']} places left" for d in idle["declined"]
    )
    return f"waited {idle['waited_s']:.1f} s for keys other processes owned" + (
        f" (not helped: {declined})" if declined else ""
    )


def summary_table(outcomes: list[Any]) -> str:
    """A markdown table of the keys tuned, one row per key."""
    lines = [
        (
            "| key | prefix | batch | trials (ok/invalid/failed) | default | best | best µs | default µs | speedup | "
            "decision | wall s |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        c = o.counts
        best_us = f"{o.best_m.median_us:.1f}" if o.best_m else "-"
        def_us = f"{o.default_m.median_us:.1f}" if o.default_m else "-"
        sp = f"{o.speedup:.2f}x" if o.speedup else "-"
        lines.append(
            f"| H={o.key.H} q={o.key.q_len}{fmt(o.key)} b{o.key.bucket} B{o.key.batch_bucket} | {o.workload.prefix} | "
            f"{o.workload.batch} | "
            f"{c.get('trials', 0)} ({c.get('ok', 0)}/{c.get('invalid', 0)}/{c.get('failed', 0)}) | "
            f"{o.default} | {o.best} | {best_us} | {def_us} | {sp} | {o.decision} | {o.wall_s:.0f} |"
        )
    return "\n".join(lines)
