"""Where the time of one launch pair goes: the kernels built with -DVA_TRACE stamp the global
timer at phase boundaries (thread 0 of each block), one pair runs alone after a warm-up, and the
stamps are read back. Printed per case, in microseconds from the first partial block's start:
when the working partial blocks pass each phase (median / max over them) and when the reduce's
blocks start, finish their plan check, are released by griddepcontrol.wait and end (and, in a
merge of many parts, when its lse loads land, its walk and its combine end). The same
cases are also timed as CUDA-graph replays plain, traced (the stamps' cost) and with
-DVA_PROFILE_EMPTY (the launch pair alone: the floor a graph replay pays). `--variant LABEL=FLAGS`
(repeatable) traces the same cases again with extra compile flags, e.g. a plan constant or a
VA_PROFILE_SKIP_* phase left out, so a change's effect shows phase by phase. `--blocks` also saves
every partial block's stamps and SM and prints bench/spread_summary.py's summary of them.

`--cases headline` traces the kernel issue's three headline shapes instead (H=8 q=9 P=46000, B=32
over prefixes 20k..70k, H=64 q=9 P=46000), `--kv-dtype` every case on that cache format.

    python3 bench/phase_trace.py --out $OUT [--variant split4=-DPLAN_SPLIT_TILES=4]   # GPU machine
    python3 bench/phase_trace.py --cases headline --kv-dtype fp8_e4m3 --out $OUT
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from pathlib import Path

# slot 7: a -DVA_PROFILE_REPEAT build's second pass starts (slots 2-5 are then that pass's)
PARTIAL = ["entry", "plan", "prologue issued", "Q + tile 0 landed", "tiles done", "epilogue done", "exit", "repeat"]
# slots 4-6: inside the merge of a request's many parts (thread 0's group, the block's last round;
# a few-parts item thread 0 merges afterwards rewrites slot 4: none at B=1)
REDUCE = ["entry", "plan check", "wait released", "exit", "lse landed", "walked", "combined"]
#: case -> (H, q_len, prefix lens), per --cases set
CASES = {
    "default": {
        "B=1 P=0": (8, 9, [0]),
        "B=1 P=4096": (8, 9, [4096]),
        "B=1 P=8192": (8, 9, [8192]),
        "B=1 P=46000": (8, 9, [46000]),
        "B=8 1x100k+7x2k": (8, 9, [100_000] + [2000] * 7),
    },
    "headline": {
        "H=8 q=9 P=46000": (8, 9, [46000]),
        "B=32 20k..70k": (8, 9, [20000 + round(50000 * i / 31) for i in range(32)]),
        "H=64 q=9 P=46000": (64, 9, [46000]),
    },
    # bandwidth mode, where e4m3's halved bytes should show most: what each format's fixed costs are
    "q1": {
        "H=8 q=1 P=16384": (8, 1, [16384]),
        "H=8 q=1 P=46000": (8, 1, [46000]),
        "H=8 q=1 P=131072": (8, 1, [131072]),
    },
}


def case_config(limits, H: int, Q: int, lens: list[int], kv_dtype: str):  # type: ignore[no-untyped-def]
    """The config a case is traced at: what the service serves an engine with that cache (each
    format's own heuristic default, not bf16's on every cache)."""
    from verify_tuner.heuristic import heuristic_config

    return heuristic_config(limits, H=H, q_len=Q, prefix=max(lens), batch=len(lens), kv_dtype=kv_dtype)


def file_name(arch: str, cases: str, kv_dtype: str) -> str:
    """phase_trace_<arch>.json for the default set on bf16, else named after the set and format."""
    tag = "".join(f"_{t}" for t, keep in ((cases, cases != "default"), (kv_dtype, kv_dtype != "bf16")) if keep)
    return f"phase_trace{tag}_{arch}.json"


def _variant(text: str) -> tuple[str, tuple[str, ...]]:
    """An argparse type: LABEL=FLAGS (flags space-separated, each starting with -D)."""
    label, sep, flags = text.partition("=")
    parts = tuple(flags.split())
    if not sep or not label or not parts or not all(f.startswith("-D") for f in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: a variant is LABEL=-DNAME[=VALUE] ...")
    return label, parts


def _trace(va, inp, out, stream, blocks: bool = False) -> dict:
    import numpy as np
    import pycuda.driver as cuda

    dev, size = va.kernels.global_ptr(b"va_trace")
    for _ in range(3):  # warm-up: module loaded, caches in their steady state
        va.run(inp, out, stream=stream)
    stream.synchronize()
    cuda.memset_d8(dev, 0, size)
    va.run(inp, out, stream=stream)
    stream.synchronize()
    raw = np.empty((2, 8192, 8), np.uint64)
    cuda.memcpy_dtoh(raw, dev)
    part, red = raw[0].astype(np.int64), raw[1].astype(np.int64)
    t0 = int(part[part[:, 0] > 0, 0].min())
    working = part[part[:, 1] > 0]
    launched = red[red[:, 0] > 0]

    def at(rows, col) -> dict:
        vals = [(int(v) - t0) / 1000 for v in rows[:, col] if v > 0]
        return {"median": round(statistics.median(vals), 2), "max": round(max(vals), 2)} if vals else {}

    extra = {}
    if blocks:  # every working partial block's stamps (us from t0) and SM, for the spread's causes
        sm_dev, _ = va.kernels.global_ptr(b"va_trace_sm")
        sms = np.empty((2, 8192), np.uint32)
        cuda.memcpy_dtoh(sms, sm_dev)
        ids = np.flatnonzero(part[:, 1] > 0)
        extra["blocks"] = {
            "slots": PARTIAL,
            "block": [int(i) for i in ids],
            "sm": [int(sms[0, i]) for i in ids],
            "us": [[round((int(v) - t0) / 1000, 3) if v > 0 else None for v in part[i]] for i in ids],
        }
    return {
        **extra,
        "partial blocks": int((part[:, 0] > 0).sum()),
        "working blocks": len(working),
        "partial": {name: at(working, i) for i, name in enumerate(PARTIAL)},
        "reduce blocks": len(launched),
        "reduce": {name: at(launched, i) for i, name in enumerate(REDUCE)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cache", default="/tmp/va-trace-cache")
    ap.add_argument("--variant", type=_variant, action="append", default=[], help="LABEL=FLAGS, repeatable")
    ap.add_argument("--cases", choices=sorted(CASES), default="default", help="which set of cases")
    ap.add_argument("--kv-dtype", default="bf16", help="the cache format of every case (kernels/formats.py)")
    ap.add_argument("--blocks", action="store_true", help="also save each partial block's stamps and SM")
    args = ap.parse_args()
    kv = args.kv_dtype

    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as cuda
    import torch
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.reference import make_inputs
    from verify_tuner.kernels.timing import rotating_inputs, time_graph

    limits, stream = read_device_limits(0), cuda.Stream()
    rows = []
    cases = CASES[args.cases]
    for (variant, extra), (case, (H, Q, lens)) in (
        (v, c) for v in [("default", ()), *args.variant] for c in cases.items()
    ):
        cfg = case_config(limits, H, Q, lens, kv)
        out = torch.empty(len(lens), Q, H, 512, dtype=torch.bfloat16, device="cuda")
        kw = {"H": H, "q_len": Q, "limits": limits, "max_batch": len(lens), "cache_dir": Path(args.cache),
              "kv_dtype": kv}  # fmt: skip
        traced = VerifyAttention(cfg, extra_flags=("-DVA_TRACE", *extra), **kw)
        row = {
            "case": case,
            "H": H,
            "q_len": Q,
            "kv_dtype": kv,
            "variant": variant,
            "flags": list(extra),
            "config": cfg.as_params(),
            **_trace(traced, make_inputs(prefix_lens=lens, q_len=Q, H=H, kv_dtype=kv), out, stream, args.blocks),
        }
        sets = rotating_inputs(prefix_lens=lens, q_len=Q, H=H, l2_bytes=limits.l2_bytes, kv_dtype=kv)
        for label, flags in (
            ("graph us", ()),
            ("graph us traced", ("-DVA_TRACE",)),
            ("graph us empty", ("-DVA_PROFILE_EMPTY",)),
        ):
            va = VerifyAttention(cfg, extra_flags=(*flags, *extra), **kw)
            row[label] = round(
                time_graph(
                    lambda k, va=va, sets=sets, out=out: va.run(sets[k], out, stream=stream), len(sets), stream=stream
                ).median_us,
                2,
            )
        rows.append(row)
        p, r = row["partial"], row["reduce"]
        print(
            f"{case} [{variant}]: graph {row['graph us']} us (traced {row['graph us traced']}, empty pair {row['graph us empty']}); "
            f"{row['working blocks']}/{row['partial blocks']} partial blocks work: "
            + ", ".join(f"{k} {v.get('median')}/{v.get('max')}" for k, v in p.items())
            + f"; reduce x{row['reduce blocks']}: "
            + ", ".join(f"{k} {v.get('median')}/{v.get('max')}" for k, v in r.items())
        )
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = {"device": limits.name, "date": dt.date.today().isoformat(), "rows": rows}
    # with every block's stamps the file is mostly numbers: compact
    text = json.dumps(stamp, separators=(",", ":")) if args.blocks else json.dumps(stamp, indent=1)
    (args.out / file_name(limits.arch, args.cases, kv)).write_text(text)
    if args.blocks:
        from spread_summary import lines

        print("\n".join(lines(stamp)))


if __name__ == "__main__":
    main()
