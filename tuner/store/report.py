"""`tuner study report`: a markdown table and a PNG per device from the config database."""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from verify_tuner import batches, buckets, engine_files
from verify_tuner.files import UMASK, write_shared
from verify_tuner.kernels import kernel_hash as current_kernel_hash
from verify_tuner.kernels.shapes import floor_bytes
from verify_tuner.keys import ConfigKey, TableKey
from verify_tuner.store import best_configs, devices, lookup, models, plan_docs, plans
from verify_tuner.store.session import session_scope

#: The prefix each stored best's study measured (None: imported, or its study gone).
Prefixes = dict[ConfigKey, int | None]


def write_report(*, sessions: sessionmaker[Session], out_dir: Path, device: str | None = None) -> list[Path]:
    """Per device: a table and a plot of tuned vs default, one line per (H, q_len, batch bucket) --
    a batch bucket is its own curve, never joined to another's -- and each graph plan's regret per
    prefix bucket."""
    with session_scope(sessions) as s:
        device = lookup.device_name(session=s, name=device)
        rows = best_configs.list_best(session=s, device=device)
        graph_plans = plans.list_plans(session=s, device=device)
        recorded = {d.name: d for d in devices.list_devices(session=s)}
        prefixes: Prefixes = {}
        for r in rows:
            if r.study_id is not None:
                st = s.get(models.Study, r.study_id)
                prefixes[r.key] = st.prefix if st else None
    if rows:  # nothing to write: no folder either
        import matplotlib  # noqa: F401  (the plots need it: missing, it stops the report before any file)

        out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    own = current_kernel_hash()
    for dev_name in sorted({r.key.device for r in rows}):
        dev_rows = [r for r in rows if r.key.device == dev_name]
        # this build's kernel first: its rows are the ones this build's sidecar serves by default
        kernels = sorted({r.key.kernel_hash for r in dev_rows}, key=lambda k: (k != own, k))
        bw = recorded[dev_name].copy_bw_gbps if dev_name in recorded else None
        stem = out_dir / f"tuned_{engine_files.slug(dev_name.lower())}"
        lines = [
            f"# Tuned vs default — {dev_name}, {dt.date.today().isoformat()}",
            "",
            "From the config database (`tuner study report`). µs are medians of interleaved re-measurements; "
            f"floor = bytes moved once / measured copy bandwidth ({bw:.0f} GB/s)."
            if bw
            else "",
        ]
        for kernel in kernels:
            lines += ["", _kernel_heading(kernel, own), ""]
            lines += _row_lines([r for r in dev_rows if r.key.kernel_hash == kernel], prefixes, bw)
            lines += _plan_lines(
                [g for g in graph_plans if (g.table.device, g.table.kernel_hash) == (dev_name, kernel)]
            )
        write_shared(stem.with_suffix(".md"), "\n".join(lines) + "\n", mode=UMASK)
        written.append(stem.with_suffix(".md"))
        dev_plans = [g for g in graph_plans if g.table.device == dev_name]
        written.append(_plot(stem.with_suffix(".png"), dev_name, dev_rows, prefixes, bw, dev_plans, own))
    return written


def _kernel_heading(kernel: str, own: str) -> str:
    """A kernel build's section: stored bests of two builds are different measurements of different code."""
    if kernel == own:
        return f"## Kernel {kernel} (this build: its sidecar serves these)"
    return f"## Kernel {kernel} (another build: served only to workers that ask for this kernel_hash)"


def _row_lines(rows: list[best_configs.BestRow], prefixes: Prefixes, bw: float | None) -> list[str]:
    lines = [
        "| kv_dtype | H | q_len | batch | bucket | prefix | config | tuned µs | default µs | speedup | floor µs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b, bb = buckets.by_index(r.key.bucket), batches.by_index(r.key.batch_bucket)
        p = prefixes.get(r.key) or b.mid
        floor = _floor_us(r.key, p, bw, bb.hi)
        stale = " (stale: not served)" if r.stale else ""
        cold = f" (timed cold: {r.neighbour_mb} MB neighbour)" if r.neighbour_mb else ""
        lines.append(
            f"| {r.key.kv_dtype} | {r.key.H} | {r.key.q_len} | {bb} | [{b.lo}, {b.hi}) | {p} | {r.config}{stale}{cold} "
            f"| {_f(r.median_us)} | {_f(r.default_us)} | {_f(r.speedup, 'x')} | {_f(floor)} |"
        )
    return lines


def _plan_lines(dev_plans: list[plans.PlanRow]) -> list[str]:
    """Each graph plan: its config, expected time and regret per prefix bucket."""
    out = []
    for g in dev_plans:
        doc = plan_docs.plan_doc(g)
        out += [
            "",
            (
                f"## Graph plan {g.table.kv_dtype} H={g.table.H} q_len={g.table.q_len} "
                f"batch {batches.by_index(g.batch_bucket)}: {g.config}"
            ),
            "",
            (
                f"Prefixes {doc['prefix_lo']}..{doc['prefix_hi']}, weights {doc['weights_source']} "
                f"({g.weights_digest[:12]}); expected {g.expected_us:.2f} µs; regret geomean "
                f"{doc['regret_geomean']:.3f}x, worst {doc['regret_worst']:.3f}x; measured {doc['measured_at']} "
                f"on {g.measured_by}."
            ),
            "",
            "| bucket | prefix | weight | plan µs | best µs | regret |",
            "|---|---|---|---|---|---|",
        ]
        out += [
            f"| [{b['prefix_lo']}, {b['prefix_hi']}) | {b['prefix']} | {b['weight']:.3f} | {b['us']:.2f} | "
            f"{b['best_us']:.2f} | {b['regret']:.3f}x |"
            for b in doc["buckets"]
        ]
    return out


def _f(v: float | None, suffix: str = "") -> str:
    return "-" if v is None else f"{v:.2f}{suffix}" if suffix else f"{v:.1f}"


def _floor_us(table: TableKey, prefix: int, bw_gbps: float | None, batch: int = 1) -> float | None:
    if not bw_gbps:
        return None
    lens = batches.draw_prefixes(batch=batch, centre=prefix)  # the ragged batch the study measured
    return floor_bytes(lens, q_len=table.q_len, H=table.H, kv_dtype=table.kv_dtype) / (bw_gbps * 1e9) * 1e6


def _plot(
    path: Path,
    dev_name: str,
    rows: list[best_configs.BestRow],
    prefixes: Prefixes,
    bw: float | None,
    dev_plans: list[plans.PlanRow],
    own: str,
) -> Path:
    """One panel per (KV format, H, q_len): each batch bucket's tuned and default times, its graph plans and
    the memory floor, one curve per kernel build (this one's in full colour)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({(r.key.kv_dtype, r.key.H, r.key.q_len) for r in rows})
    kernels = sorted({r.key.kernel_hash for r in rows}, key=lambda k: (k != own, k))
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.6), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        of_shape = [r for r in rows if (r.key.kv_dtype, r.key.H, r.key.q_len) == shape]
        # one curve per (kernel build, batch bucket): neither two builds nor two batch sizes are joined
        for n, bi in enumerate(sorted({r.key.batch_bucket for r in of_shape})):
            in_batch = [r for r in of_shape if r.key.batch_bucket == bi]
            for kernel in kernels:
                tag, alpha = ("", 1.0) if len(kernels) == 1 else (f" {kernel[:8]}", 1.0 if kernel == own else 0.45)
                style = {"color": f"C{n % 10}", "alpha": alpha}
                _plot_curves(ax, [r for r in in_batch if r.key.kernel_hash == kernel], prefixes, dev_plans, tag, style)
            x = sorted({prefixes.get(r.key) or buckets.by_index(r.key.bucket).mid for r in in_batch})
            if bw:
                floor = [_floor_us(in_batch[0].key, p, bw, batches.by_index(bi).hi) for p in x]
                ax.plot(x, [f or float("nan") for f in floor], "k:", lw=0.8)
        ax.set_xscale("log")
        if bw or any(r.default_us or r.median_us for r in of_shape):  # rows imported without times plot nothing
            ax.set_yscale("log")
        ax.set_title("{} H={} q_len={}".format(*shape))
        ax.set_xlabel("prefix tokens")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("µs")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"verify attention: tuned vs default, {dev_name}")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    write_shared(path, png.getvalue(), mode=UMASK)
    return path


def _plot_curves(
    ax: Any,
    rows: list[best_configs.BestRow],
    prefixes: Prefixes,
    dev_plans: list[plans.PlanRow],
    tag: str,
    style: dict[str, Any],
) -> None:
    """One kernel build's curves of one batch bucket: default and tuned per prefix bucket, and its graph plans."""
    if not rows:
        return
    rows = sorted(rows, key=lambda r: r.key.bucket)
    bb = batches.by_index(rows[0].key.batch_bucket)
    x = [prefixes.get(r.key) or buckets.by_index(r.key.bucket).mid for r in rows]
    ax.plot(x, [r.default_us or float("nan") for r in rows], "s:", ms=3, label=f"default B={bb}{tag}", **style)
    ax.plot(x, [r.median_us or float("nan") for r in rows], "^-", ms=4, label=f"tuned B={bb}{tag}", **style)
    for g in dev_plans:
        if g.table == rows[0].key.table and g.batch_bucket == bb.index:
            px = [b["prefix"] for b in g.per_bucket]
            ax.plot(px, [b["us"] for b in g.per_bucket], "--", lw=1, label=f"graph plan B={bb}{tag}", **style)
