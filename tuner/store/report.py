"""`tuner study report`: a markdown table and a PNG per device from the config database."""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker
from verify_tuner import buckets, engine_files
from verify_tuner.files import write_shared
from verify_tuner.kernels.shapes import floor_bytes
from verify_tuner.store import repo
from verify_tuner.store.session import session_scope


def write_report(*, sessions: sessionmaker[Session], out_dir: Path, device: str | None = None) -> list[Path]:
    with session_scope(sessions) as s:
        rows = repo.list_best(session=s, device=device)
        devices = {d.name: d for d in repo.list_devices(session=s)}
        prefixes = {}
        for r in rows:
            if r.study_id is not None:
                st = s.get(repo.Study, r.study_id)
                prefixes[r.key] = st.prefix if st else None
    if rows:  # nothing to write: no folder either
        out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for dev_name in sorted({r.key.device for r in rows}):
        dev_rows = [r for r in rows if r.key.device == dev_name]
        bw = devices[dev_name].copy_bw_gbps if dev_name in devices else None
        stem = out_dir / f"tuned_{engine_files.slug(dev_name.lower())}"
        lines = [
            f"# Tuned vs default — {dev_name}, {dt.date.today().isoformat()}",
            "",
            "From the config database (`tuner study report`). µs are medians of interleaved re-measurements; "
            f"floor = bytes moved once / measured copy bandwidth ({bw:.0f} GB/s)."
            if bw
            else "",
            "",
            "| H | q_len | bucket | prefix | config | tuned µs | default µs | speedup | floor µs |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in dev_rows:
            b = buckets.by_index(r.key.bucket)
            p = prefixes.get(r.key) or b.mid
            floor = _floor_us(r.key.H, r.key.q_len, p, bw)
            lines.append(
                f"| {r.key.H} | {r.key.q_len} | [{b.lo}, {b.hi}) | {p} | {r.config} | {_f(r.median_us)} | "
                f"{_f(r.default_us)} | {_f(r.speedup, 'x')} | {_f(floor)} |"
            )
        write_shared(stem.with_suffix(".md"), "\n".join(lines) + "\n")
        written.append(stem.with_suffix(".md"))
        written.append(_plot(stem.with_suffix(".png"), dev_name, dev_rows, prefixes, bw))
    return written


def _f(v: float | None, suffix: str = "") -> str:
    return "-" if v is None else f"{v:.2f}{suffix}" if suffix else f"{v:.1f}"


def _floor_us(H: int, q_len: int, prefix: int, bw_gbps: float | None) -> float | None:
    if not bw_gbps:
        return None
    return floor_bytes([prefix], q_len=q_len, H=H) / (bw_gbps * 1e9) * 1e6


def _plot(path: Path, dev_name: str, rows, prefixes, bw) -> Path:  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r.key.H, r.key.q_len) for r in rows})
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6), squeeze=False)
    for ax, (H, q) in zip(axes[0], keys):
        rs = sorted((r for r in rows if (r.key.H, r.key.q_len) == (H, q)), key=lambda r: r.key.bucket)
        x = [prefixes.get(r.key) or buckets.by_index(r.key.bucket).mid for r in rs]
        ax.plot(x, [r.default_us or float("nan") for r in rs], "b-s", ms=4, label="heuristic default")
        ax.plot(x, [r.median_us or float("nan") for r in rs], "g-^", ms=4, label="tuned")
        if bw:
            ax.plot(x, [_floor_us(H, q, p, bw) for p in x], "k--", label="memory floor")
        ax.set_xscale("log")
        if bw or any(r.default_us or r.median_us for r in rs):  # rows imported without times plot nothing
            ax.set_yscale("log")
        ax.set_title(f"H={H} q_len={q}")
        ax.set_xlabel("prefix tokens")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("µs")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"verify attention: tuned vs default, {dev_name}")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    write_shared(path, png.getvalue())
    return path
