"""Several configs in one captured graph, the step's prefix choosing (bench/graph_switch.py): is it
correct, and what does the switch cost where it runs the long-prefix config?

At B=1 H=8 q=9, for every prefix in --prefixes: each config alone (the heuristic L and the short-prefix
candidates), then L behind a switch (a setter + SWITCH node per layer), then the switched pairs. Every variant is gated against the fp32 reference inside a
captured graph before it is timed; CUDA-graph replays, inputs rotated past the L2, and with
--neighbour-mb a cold column (a GEMM after every launch, its own time subtracted).

    python3 bench/graph_switch_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

from benchlib import parse_config

H, Q = 8, 9
SHORT = {
    "S16": "NSPLIT=32 HT=2 TK=16 BLOCK=128 STAGES=2 QT=5 WR=1 WK=4 SF=0 PIPE=1",
    "S24": "NSPLIT=24 HT=8 TK=32 BLOCK=256 STAGES=3 QT=2 WR=2 WK=2 SF=0 PIPE=1",
    "S66": "NSPLIT=66 HT=4 TK=32 BLOCK=256 STAGES=4 QT=0 WR=2 WK=2 SF=1 PIPE=0",
}

# (label, branches, bounds); "sw[L|L]" runs L behind a switch at every prefix: the switch's own cost
SWITCHED = [
    ("sw[L|L]@1", ["L", "L"], [1]),
    ("sw[S16|L]@2048", ["S16", "L"], [2048]),
    ("sw[S24|L]@4096", ["S24", "L"], [4096]),
    ("sw[S16|S24|S66|L]@1448,4096,11585", ["S16", "S24", "S66", "L"], [1448, 4096, 11585]),
]


class Stream:  # what VerifyAttention takes: an object with a CUstream handle
    def __init__(self, handle: int) -> None:
        self.handle = handle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefixes", default="0,1218,2435,4096,8192,46000,131072")
    ap.add_argument("--neighbour-mb", type=int, default=128)
    ap.add_argument("--cache", default="/tmp/va-cache")
    args = ap.parse_args()

    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as cuda
    from graph_switch import GraphSwitch, compile_switch_cubin
    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.timing import neighbour_gemm

    limits = read_device_limits(0)
    cache = Path(args.cache)
    stream = cuda.Stream()
    configs = {"L": heuristic_config(limits, H=H, q_len=Q, prefix=0)} | {k: parse_config(v) for k, v in SHORT.items()}
    vas = {k: VerifyAttention(c, H=H, q_len=Q, limits=limits, max_batch=1, cache_dir=cache) for k, c in configs.items()}
    sw = GraphSwitch(compile_switch_cubin(limits.arch, cache))
    neighbour = neighbour_gemm(args.neighbour_mb) if args.neighbour_mb else None
    rows = []
    for P in [int(x) for x in args.prefixes.split(",")]:
        rows += probe_prefix(P, vas, sw, stream, neighbour, limits)
    doc = {
        "device": limits.name,
        "date": dt.date.today().isoformat(),
        "command": "python3 bench/graph_switch_probe.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "configs": {k: str(c) for k, c in configs.items()},
        "rows": rows,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "graph_switch_probe_sm_90.json").write_text(json.dumps(doc, indent=1))
    print("\n| P | " + " | ".join(dict.fromkeys(r["variant"] for r in rows)) + " |")
    by_p: dict[int, dict[str, dict]] = {}
    for r in rows:
        by_p.setdefault(r["P"], {})[r["variant"]] = r
    for P, vs in by_p.items():
        cells = [f"{v['us']}" + (f" / {v['cold_us']}" if "cold_us" in v else "") for v in vs.values()]
        print(f"| {P} | " + " | ".join(cells) + " |")


def probe_prefix(P, vas, sw, stream, neighbour, limits) -> list[dict]:
    """Every variant at B=1 prefix P: gated in a captured graph, then timed (and cold)."""
    import torch
    from graph_switch import branch_of
    from verify_tuner.kernels.reference import reference, rel_error
    from verify_tuner.kernels.timing import rotating_inputs, time_graph

    ext = torch.cuda.ExternalStream(stream.handle)
    rows = []
    sets = rotating_inputs(prefix_lens=[P], q_len=Q, H=H, l2_bytes=limits.l2_bytes, seed=P % 997)
    ref = reference(sets[0])[0]
    out = torch.empty(1, Q, H, 512, dtype=torch.bfloat16, device="cuda")

    def pair(name, k, s):
        vas[name].run(sets[k], out, stream=Stream(s))

    def switch_launch(names, bounds):
        def launch(k):
            if not sw.capturing(stream.handle):  # warm-up outside the capture: the branch the setter picks
                pair(names[branch_of(P, bounds)], k, stream.handle)
                return
            sw.enqueue(
                stream=stream.handle,
                indptr=sets[k].prefix_indptr.data_ptr(),
                batch=1,
                bounds=bounds,
                branches=[lambda s, n=n: pair(n, k, s) for n in names],
            )

        return launch

    def gated(launch):
        """Capture one launch on set 0, poison, replay, compare."""
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=ext):
            launch(0)
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        return rel_error(out, ref)

    variants = [(k, (lambda k_, n=k: pair(n, k_, stream.handle)), 1) for k in vas]
    variants += [("Lx2", lambda k: (pair("L", k, stream.handle), pair("L", k, stream.handle)), 2)]
    variants += [(lab, switch_launch(n, b), 1) for lab, n, b in SWITCHED]
    alone = time_graph(lambda k: None, len(sets), stream=stream, between=neighbour) if neighbour else None
    for label, launch, layers in variants:
        err = gated(launch)
        if not err <= 1e-2:
            raise SystemExit(f"WRONG {label} at P={P}: rel err {err:.3g}")
        t = time_graph(launch, len(sets), stream=stream)
        row = {"P": P, "variant": label, "layers": layers, "us": round(t.median_us / layers, 2), "rel_err": err}
        row["pdl"] = vas["L"].kernels.uses_pdl
        if neighbour:
            c = time_graph(launch, len(sets), stream=stream, between=neighbour)
            row["cold_us"] = round((c.median_us - alone.median_us) / layers, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    main()
