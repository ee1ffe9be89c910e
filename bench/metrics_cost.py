"""What the /metrics bookkeeping costs a request: the middleware's `request` plus the route's
`lookup` call, timed in a loop, for prometheus_client (api/metrics.py) and, given a commit, for the
hand-written exposition it replaced. Writes metrics_cost.json into --out.

    python bench/metrics_cost.py [--old-commit 97e9d8b]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import platform
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def per_request_us(metrics, n: int = 200_000) -> float:  # type: ignore[no-untyped-def]
    def one() -> None:
        metrics.request("/config", "GET", 200, 0.0004)
        metrics.lookup("tuned")

    return min(timeit.repeat(one, number=n, repeat=3)) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-commit", default=None, help="also time api/metrics.py of this commit")
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    args = ap.parse_args()
    from verify_tuner.api.metrics import Metrics

    rows = {"prometheus_client": per_request_us(Metrics(version="bench", kernel_hash="bench", kernel_version="2"))}
    if args.old_commit:
        src = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{args.old_commit}:api/metrics.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(src)
        spec = importlib.util.spec_from_file_location("old_metrics", f.name)
        old = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(old)  # type: ignore[union-attr]
        rows[f"hand-written ({args.old_commit})"] = per_request_us(old.Metrics())
    res = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "python": platform.python_version(),
        "us_per_request": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "metrics_cost.json").write_text(json.dumps(res, indent=1))
    for k, v in rows.items():
        print(f"{k}: {v:.2f} us per request")


if __name__ == "__main__":
    main()
