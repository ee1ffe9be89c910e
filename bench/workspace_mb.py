"""The verify op's workspace for an engine's captured batch sizes, with each device's default
(heuristic) config: one buffer per batch size, as the op keeps them when it is passed none,
against one buffer shared by every batch size and layer (VerifyMLABackend's), sized for the
largest. Arithmetic only (kernels/abi.py's LaunchSpec.workspace_bytes), so it runs anywhere.

    python3 bench/workspace_mb.py [--batches 1,2,4,8,16,32,64] [--q-len 9] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from verify_tuner.engine.op import config_list, shared_workspace_bytes, workspace_bytes
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.limits import known_device

DEVICES = ("rtx-pro-6000", "h200")
HEADS = (8, 16, 32, 64, 128)  # heads per GPU: a 128-head model at TP16 .. TP1


def rows(batches: list[int], q_len: int) -> list[dict]:
    out = []
    for device in DEVICES:
        limits = known_device(device)
        for H in HEADS:
            cfgs = {
                bs: config_list(heuristic_config(limits, H=H, q_len=q_len, prefix=4096, batch=bs)) for bs in batches
            }
            per_batch = sum(workspace_bytes(c, H=H, q_len=q_len, batch=bs) for bs, c in cfgs.items())
            shared = shared_workspace_bytes(cfgs, H=H, q_len=q_len)
            out.append({
                "device": limits.name, "H": H, "q_len": q_len, "NSPLIT": sorted({c[0] for c in cfgs.values()}),
                "one per batch size MB": round(per_batch / 2**20, 1), "one shared MB": round(shared / 2**20, 1),
            })  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--q-len", type=int, default=9)
    ap.add_argument("--out", type=Path, help="folder to write workspace_mb.json into")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    table = rows(batches, args.q_len)
    print(f"captured batch sizes {batches}, q_len {args.q_len}")
    print("| device | H | NSPLIT | one per batch size (MB) | one shared (MB) |\n|---|---|---|---|---|")
    for r in table:
        print(f"| {r['device']} | {r['H']} | {r['NSPLIT']} | {r['one per batch size MB']} | {r['one shared MB']} |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "workspace_mb.json").write_text(json.dumps({"batches": batches, "rows": table}, indent=1))


if __name__ == "__main__":
    main()
