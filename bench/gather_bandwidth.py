"""Cache rows gathered by slot index with torch.index_select (576 bf16 = 1152 B, or an e4m3 row's
576 B; uint8 elements), scattered (a random permutation of the pool) or contiguous, against a plain
device-to-device copy. Bytes counted read + written, like the copy bandwidth the floors use. It
probes torch's gather, not a bound of the kernel: 576-byte rows came out at 0.55-0.60 of copy
scattered and contiguous alike (H100, bench/results/ab_kernel_flags_sm_90.md), which the kernel's
own reads exceed; the layout question is answered by `ab_kernel.py --layout`.

    python3 bench/gather_bandwidth.py --out OUT [--row-bytes 1152,576]
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
    ap.add_argument(
        "--row-bytes",
        default=f"{2 * D_QK},{D_QK}",
        help="row sizes in bytes, comma-separated (default: a bf16 row and an e4m3 one)",
    )
    args = ap.parse_args()
    try:
        widths = [int(w) for w in args.row_bytes.split(",")]
    except ValueError:
        ap.error(f"--row-bytes {args.row_bytes!r}: whole numbers of bytes, comma-separated")
    if not widths or min(widths) < 1:
        ap.error(f"--row-bytes {args.row_bytes!r}: each row holds at least one byte")
    import torch
    from verify_tuner.kernels.timing import copy_bandwidth

    rows = []
    copy = copy_bandwidth()
    for width in widths:
        for n in (46009, 131073):
            sets = 4
            kv = [torch.randint(0, 256, (n, width), dtype=torch.uint8, device="cuda") for _ in range(sets)]
            idx = {
                "scattered": [torch.randperm(n, device="cuda") for _ in range(sets)],
                "contiguous": [torch.arange(n, device="cuda") for _ in range(sets)],
            }
            out = torch.empty(n, width, dtype=torch.uint8, device="cuda")
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
                gbps = 2 * n * width / us / 1e3
                row = {"row_bytes": width, "rows": n, "layout": layout, "us": us, "GBps_rw": gbps}
                rows.append(row | {"vs_copy": gbps / (copy / 1e9)})
                print(
                    f"{width:5d} B {n:7d} rows {layout:10s} {us:7.1f} us  {gbps:6.0f} GB/s (r+w)  "
                    f"{gbps / (copy / 1e9):.2f} of copy",
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
