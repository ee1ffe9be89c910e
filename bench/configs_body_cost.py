"""What the sidecar spends on GET /configs?all_batches=true (every batch bucket's table, what a
worker fetches at startup), in-process on an empty SQLite database (heuristic answers: the same
body size as a tuned table):

- the request through FastAPI's TestClient, which splices the body from the answers each cached
  table rendered once (verify_tuner.api.routes.config._table_body), and /config and a one-bucket /configs for
  comparison;
- the body built the way the route did before, per request: a ConfigTableOut of every answer,
  serialised, hashed (timed directly on the same cached tables), against the splice and hash.

    python3 bench/configs_body_cost.py --out OUT
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _ms(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    rounds = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t) / n * 1e3)
    return round(statistics.median(rounds), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument("--requests", type=int, default=300)
    args = ap.parse_args()

    from fastapi.testclient import TestClient
    from verify_tuner import batches
    from verify_tuner.api.app import create_app
    from verify_tuner.api.key_query import KeyQuery
    from verify_tuner.api.routes.config import _table_body
    from verify_tuner.api.schemas import ConfigOut, ConfigTableOut
    from verify_tuner.keys import TableKey
    from verify_tuner.settings import Settings
    from verify_tuner.store import migrate

    url = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    migrate.upgrade(url)
    paths = {
        "/configs all_batches": "/configs?H=8&q_len=9&device=h200&all_batches=true",
        "/configs one batch bucket": "/configs?H=8&q_len=9&device=h200",
        "/config one lookup": "/config?H=8&q_len=9&prefix=46000&device=h200",
    }
    app = create_app(Settings(database_url=url))
    result: dict[str, object] = {}
    with TestClient(app) as c:
        for name, path in paths.items():
            size = len(c.get(path).content)
            result[name] = {"bytes": size, "ms_per_request_testclient": _ms(lambda p=path: c.get(p), args.requests)}
            print(f"{name:28s} {result[name]['ms_per_request_testclient']:6.2f} ms/request ({size} B)", flush=True)
        cache = app.state.tables
        key = TableKey("h200", cache.own_kernel, "bf16", 8, 9)
        tables = [cache.fresh(KeyQuery(tuple(key.values().items())), b.index) for b in batches.ALL]
        assert all(t is not None for t in tables)

    def rendered() -> bytes:  # the route before: a model of every answer, serialised, hashed
        answers = [a for t in tables for a in t.answers]
        body = (
            ConfigTableOut(
                **tables[0].key.values(),
                dtype=tables[0].key.kv_dtype,
                configs=[ConfigOut.of(a) for a in answers],
            )
            .model_dump_json()
            .encode()
        )
        hashlib.sha256(body).hexdigest()
        return body

    def spliced() -> bytes:
        body = _table_body(tables)
        hashlib.sha256(body).hexdigest()
        return body

    assert rendered() == spliced()
    result["all_batches body + ETag, ms"] = {
        "rendered per request": _ms(rendered, args.requests),
        "spliced from the tables": _ms(spliced, args.requests),
    }
    print(f"all_batches body + ETag: {result['all_batches body + ETag, ms']}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.node()} {os.cpu_count()} cores",
        "python": platform.python_version(),
        "requests_per_round": args.requests,
        "results": result,
    }
    (args.out / "configs_body_cost.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
