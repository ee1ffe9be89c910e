"""What the memory system gives this kernel's access pattern: rows of 576 bf16 (1152 B) gathered
by slot index, scattered (a random permutation of the pool) or contiguous, against a plain
device-to-device copy. Bytes counted read + written, like the copy bandwidth the floors use.

    python3 bench/gather_bandwidth.py --out OUT
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify_tuner.kernels.shapes import D_QK


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    args = ap.parse_args()
    import torch
    from verify_tuner.kernels.timing import copy_bandwidth

    rows = []
    copy = copy_bandwidth()
    for n in (46009, 131073):
        sets = 4
        kv = [torch.randn(n, D_QK, device="cuda").to(torch.bfloat16) for _ in range(sets)]
        idx = {
            "scattered": [torch.randperm(n, device="cuda") for _ in range(sets)],
            "contiguous": [torch.arange(n, device="cuda") for _ in range(sets)],
        }
        out = torch.empty(n, D_QK, dtype=torch.bfloat16, device="cuda")
        for layout, ids in idx.items():
            for k in range(sets):
                torch.index_select(kv[k], 0, ids[k], out=out)
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            reps = 20
            start.record()
            for r in range(reps):
                torch.index_select(kv[r % sets], 0, ids[r % sets], out=out)
            stop.record()
            torch.cuda.synchronize()
            us = start.elapsed_time(stop) * 1000 / reps
            gbps = 2 * n * 1152 / us / 1e3
            rows.append({"rows": n, "layout": layout, "us": us, "GBps_rw": gbps, "vs_copy": gbps / (copy / 1e9)})
            print(
                f"{n:7d} rows {layout:10s} {us:7.1f} us  {gbps:6.0f} GB/s (r+w)  {gbps / (copy / 1e9):.2f} of copy",
                flush=True,
            )
        del kv, idx, out
        torch.cuda.empty_cache()
    name = torch.cuda.get_device_name()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": name, "date": dt.date.today().isoformat(), "copy_GBps": copy / 1e9, "rows": rows}
    (args.out / "gather_bandwidth.json").write_text(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
