"""What the sidecar spends on GET /configs?all_batches=true (every batch bucket's table, what a
worker fetches at startup): rendered per request (the body cache off) vs kept per set of cached
tables (api.routes.config.TableBodies), in-process through FastAPI's TestClient on an empty
SQLite database (heuristic answers, the same body size as a tuned table). Writes JSON.

    python3 bench/configs_body_cost.py --out bench/results
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--requests", type=int, default=300)
    args = ap.parse_args()

    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.routes.config import TableBodies
    from tuner.db import migrate
    from tuner.settings import Settings

    url = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    migrate.upgrade(url)
    paths = {"/configs all_batches": "/configs?H=8&q_len=9&device=h200&all_batches=true",
             "/configs one batch bucket": "/configs?H=8&q_len=9&device=h200",
             "/config one lookup": "/config?H=8&q_len=9&prefix=46000&device=h200"}
    result: dict[str, dict[str, float]] = {}
    for mode, keep in (("rendered per request", 0), ("kept per table set", TableBodies.MAX_ENTRIES)):
        TableBodies.MAX_ENTRIES = keep
        app = create_app(Settings(database_url=url))
        with TestClient(app) as c:
            for name, path in paths.items():
                size = len(c.get(path).content)
                rounds = []
                for _ in range(3):  # median of three rounds
                    t = time.perf_counter()
                    for _ in range(args.requests):
                        c.get(path)
                    rounds.append((time.perf_counter() - t) / args.requests * 1e3)
                result.setdefault(name, {"bytes": size})[mode] = round(statistics.median(rounds), 3)
                print(f"{mode:22s} {name:28s} {result[name][mode]:6.2f} ms/request ({size} B)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"date": dt.date.today().isoformat(), "machine": f"{platform.node()} {os.cpu_count()} cores",
            "python": platform.python_version(), "requests_per_round": args.requests, "ms_per_request": result}
    (args.out / "configs_body_cost.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
