"""The runtime work split on the GPU, as engines run it: the targets of the runtime-split issue in one call.

Rows (H=8 q=9 unless named; each config gated against the fp32 reference before it is timed; CUDA-graph
replays, inputs rotated past the L2):
- follow: one graph captured at P=1000 with the P=1000 heuristic config, its buffers refilled and
  replayed at P = 4096, 46000, 131072, against the best of a candidate set measured fresh at each P;
- ragged: 1x100k + 7x2k (B=8) and 1x120k + 31x1k (B=32), against the long request alone;
- uniform: B=32 with prefixes 20k..70k, against max(HBM floor, FLOP / 645 TFLOP/s);
- short: B=1 at P=0 and P=4096;
- variants: the default (no row splits since kernel v6) against row splits built in
  (-DVA_ROWSPLIT=3) on short prefixes, a short batch, B=1 46k and ragged B=8.
Each row: us, limit_us, achieved TB/s and TFLOP/s, and the partial kernel's own time; with
--neighbour-mb (default 128) also cold_us, the pair followed in its graph by a bf16 GEMM streaming
that many MB (the rest of an engine's layer: cold instruction and data caches), the GEMM's own
time subtracted.

    python3 bench/runtime_split.py --out OUT
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
from dataclasses import replace
from pathlib import Path

from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.shapes import floor_bytes, flops
from verify_tuner.kernels.timing import check_neighbour_mb

H, Q = 8, 9
MMA_TFLOPS = 645.0  # mma.sync ceiling on the H200 (../shared/anchors/h200.md)


class Bench:
    def __init__(self, cache: str, neighbour_mb: int = 0) -> None:
        import pycuda.autoprimaryctx  # noqa: F401
        import pycuda.driver as cuda
        from verify_tuner.kernels.limits import read_device_limits
        from verify_tuner.kernels.timing import copy_bandwidth

        self.limits = read_device_limits(0)
        self.bw = copy_bandwidth()
        self.stream = cuda.Stream()
        self.cache = Path(cache)
        self.neighbour = None
        if neighbour_mb:
            from verify_tuner.kernels.timing import neighbour_gemm

            self.neighbour = neighbour_gemm(neighbour_mb)

    def limit_us(self, lens: list[int], h: int = H, q: int = Q) -> float:
        mem = floor_bytes(lens, q_len=q, H=h) / self.bw * 1e6
        return max(mem, flops(lens, q_len=q, H=h) / (MMA_TFLOPS * 1e12) * 1e6)

    def launcher(self, cfg, batch: int, flags: tuple[str, ...] = (), h: int = H, q: int = Q):
        from verify_tuner.kernels.launch import VerifyAttention

        return VerifyAttention(
            cfg, H=h, q_len=q, limits=self.limits, max_batch=batch, cache_dir=self.cache, extra_flags=flags
        )

    def time(self, cfg, lens: list[int], flags: tuple[str, ...] = (), h: int = H, q: int = Q) -> dict:
        """Gate, then time partial + reduce and the partial alone, in graphs."""
        import torch
        from verify_tuner.kernels.reference import poisoned_run_error, reference
        from verify_tuner.kernels.timing import rotating_inputs, time_graph

        sets = rotating_inputs(prefix_lens=lens, q_len=q, H=h, l2_bytes=self.limits.l2_bytes, seed=sum(lens) % 997)
        va = self.launcher(cfg, len(lens), flags, h, q)
        out = torch.empty(len(lens), q, h, 512, dtype=torch.bfloat16, device="cuda")
        err = poisoned_run_error(lambda: va.run(sets[0], out, stream=self.stream), out, reference(sets[0])[0])
        if not err <= 1e-2:
            raise SystemExit(f"WRONG {cfg} {flags} at {lens[:4]}...: rel err {err:.3g}")
        full = time_graph(lambda k: va.run(sets[k], out, stream=self.stream), len(sets), stream=self.stream)
        part = time_graph(
            lambda k: va.run(sets[k], out, stream=self.stream, reduce=False), len(sets), stream=self.stream
        )
        row = self.row(cfg, lens, full.median_us, part.median_us, flags, err, h, q)
        if self.neighbour is not None:
            cold = time_graph(
                lambda k: va.run(sets[k], out, stream=self.stream),
                len(sets),
                stream=self.stream,
                between=self.neighbour,
            )
            alone = time_graph(lambda k: None, len(sets), stream=self.stream, between=self.neighbour)
            row["cold_us"] = round(cold.median_us - alone.median_us, 2)
        return row

    def row(self, cfg, lens, us, partial_us, flags, err, h=H, q=Q) -> dict:
        return {
            "config": str(cfg),
            "flags": " ".join(flags),
            "us": round(us, 2),
            "partial_us": None if partial_us is None else round(partial_us, 2),
            "limit_us": round(self.limit_us(lens, h, q), 2),
            "tbps": round(floor_bytes(lens, q_len=q, H=h) / us / 1e6, 3),
            "tflops": round(flops(lens, q_len=q, H=h) / us / 1e6, 1),
            "rel_err": err,
        }

    def follow(self, capture_p: int, replay: list[int]) -> list[dict]:
        """One graph captured at capture_p, refilled and replayed at each P of `replay`."""
        import torch
        from verify_tuner.kernels.reference import make_inputs, reference, rel_error

        cfg = heuristic_config(self.limits, H=H, q_len=Q, prefix=capture_p)
        n_sets, rows = 4, []  # 4 sets of the largest prefix exceed the L2 several times over
        big = max(replay + [capture_p])
        sets = [_buffers(big) for _ in range(n_sets)]
        va = self.launcher(cfg, 1)
        for k, s in enumerate(sets):
            _load(s, make_inputs(prefix_lens=[capture_p], q_len=Q, H=H, seed=k))
        order = list(range(n_sets)) * 6
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=torch.cuda.ExternalStream(self.stream.handle)):
            for k in order:
                _launch(va, sets[k], self.stream)
        for p in replay:
            inputs = [make_inputs(prefix_lens=[p], q_len=Q, H=H, seed=100 + k) for k in range(n_sets)]
            for s, inp in zip(sets, inputs):
                _load(s, inp)
            graph.replay()
            torch.cuda.synchronize()
            err = rel_error(sets[order[-1]]["out"], reference(inputs[order[-1]])[0])
            if not err <= 1e-2:
                raise SystemExit(f"WRONG graph captured at {capture_p}, replayed at {p}: {err:.3g}")
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(15)]
            for a, b in events:
                a.record()
                graph.replay()
                b.record()
            torch.cuda.synchronize()
            us = sorted(a.elapsed_time(b) * 1000 / len(order) for a, b in events)[len(events) // 2]
            rows.append(
                {
                    "case": f"graph captured at P={capture_p}, replayed at P={p}",
                    "prefix": p,
                    **self.row(cfg, [p], us, None, (), err),
                }
            )
        return rows

    def fresh_best(self, p: int) -> dict:
        """The best of a candidate set at P, each measured on its own."""
        base = heuristic_config(self.limits, H=H, q_len=Q, prefix=p)
        cands = {base, heuristic_config(self.limits, H=H, q_len=Q, prefix=1000)}
        cands |= {replace(base, nsplit=n) for n in (66, 264)}
        cands |= {replace(base, stages=3, wr=2, wk=2, sf=0, pipe=0), replace(base, stages=3, wr=2, wk=2, sf=1, pipe=3)}
        rows = [self.time(c, [p]) for c in sorted(cands)]
        return min(rows, key=lambda r: r["us"])


def _buffers(max_prefix: int) -> dict:
    import torch

    d = "cuda"
    return {
        "q": torch.empty(1, Q, H, 576, dtype=torch.bfloat16, device=d),
        "kv": torch.empty(max_prefix + Q, 576, dtype=torch.bfloat16, device=d),
        "prefix_indices": torch.empty(max_prefix, dtype=torch.int32, device=d),
        "prefix_indptr": torch.empty(2, dtype=torch.int32, device=d),
        "draft_indices": torch.empty(1, Q, dtype=torch.int32, device=d),
        "tree_mask": torch.empty(1, Q, dtype=torch.int64, device=d),
        "out": torch.empty(1, Q, H, 512, dtype=torch.bfloat16, device=d),
        "scale": 576**-0.5,
    }


def _load(buf: dict, inp) -> None:
    for name in ("q", "prefix_indptr", "draft_indices", "tree_mask"):
        buf[name].copy_(getattr(inp, name))
    buf["kv"][: inp.kv.shape[0]].copy_(inp.kv)
    buf["prefix_indices"][: inp.prefix_indices.numel()].copy_(inp.prefix_indices)
    buf["out"].fill_(float("nan"))


def _launch(va, buf: dict, stream) -> None:
    va(
        q=buf["q"],
        kv=buf["kv"],
        prefix_indices=buf["prefix_indices"],
        prefix_indptr=buf["prefix_indptr"],
        draft_indices=buf["draft_indices"],
        tree_mask=buf["tree_mask"],
        out=buf["out"],
        batch=1,
        softmax_scale=buf["scale"],
        stream=stream,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument("--cache", default=os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache"))
    ap.add_argument("--neighbour-mb", type=int, default=128, help="the GEMM of cold_us (0: no cold_us)")
    args = ap.parse_args()
    try:
        check_neighbour_mb(args.neighbour_mb)
    except ValueError as exc:
        ap.error(str(exc))
    b = Bench(args.cache, args.neighbour_mb)
    rows: list[dict] = []

    def add(case: str, lens: list[int], flags: tuple[str, ...] = (), cfg=None, **extra) -> dict:
        cfg = cfg or heuristic_config(b.limits, H=H, q_len=Q, prefix=max(lens), batch=len(lens))
        r = {"case": case, "batch": len(lens), **b.time(cfg, lens, flags), **extra}
        rows.append(r)
        print(json.dumps(r), flush=True)
        return r

    for r in b.follow(1000, [4096, 46000, 131072]):
        best = b.fresh_best(r["prefix"])
        r.update(fresh_best_us=best["us"], fresh_best_config=best["config"], ratio=round(r["us"] / best["us"], 3))
        rows.append(r)
        print(json.dumps(r), flush=True)
    alone100 = add("long request alone: 1 x 100k", [100_000])
    add("ragged B=8: 1 x 100k + 7 x 2k", [100_000] + [2000] * 7)
    rows[-1]["vs_alone"] = round(rows[-1]["us"] / alone100["us"], 3)
    alone120 = add("long request alone: 1 x 120k", [120_000])
    add("ragged B=32: 1 x 120k + 31 x 1k", [120_000] + [1000] * 31)
    rows[-1]["vs_alone"] = round(rows[-1]["us"] / alone120["us"], 3)
    uniform = [20_000 + round(50_000 * i / 31) for i in range(32)]
    add("uniform B=32: 20k..70k", uniform)
    rows[-1]["vs_limit"] = round(rows[-1]["us"] / rows[-1]["limit_us"], 3)
    add("B=1 P=1000", [1000])
    # the plan without and with row splits (splitting while parts would hold < 2 or 4 tiles, the
    # variants before: 21f55e5:bench/results/runtime_sm_90.md)
    for flags in ((), ("-DVA_ROWSPLIT=3",)):
        tag = " ".join(flags) or "default plan"
        for P in (0, 1218, 2435, 4096, 8192):
            add(f"B=1 P={P} [{tag}]", [P], flags)
        add(f"B=8 P=1218 [{tag}]", [1218] * 8, flags)
        add(f"B=1 P=46000 [{tag}]", [46000], flags)
        add(f"ragged B=8 [{tag}]", [100_000] + [2000] * 7, flags)
    import torch

    meta = {
        "device": b.limits.name,
        "arch": b.limits.arch,
        "date": dt.date.today().isoformat(),
        "copy_bw_tbps": round(b.bw / 1e12, 3),
        "neighbour_mb": args.neighbour_mb,
        "torch": torch.__version__,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"runtime_{b.limits.arch}.json").write_text(json.dumps(meta, indent=1))
    lines = [
        f"# Runtime work split ({meta['device']}, {meta['date']}; `python3 bench/runtime_split.py`)",
        "",
        (
            f"cold us: the pair with a bf16 GEMM over {args.neighbour_mb} MB of weights after every launch in its "
            "graph (an engine's layer between two steps), the GEMM's own time subtracted."
        ),
        "",
        "| case | us | partial us | cold us | limit us | TB/s | TFLOP/s | vs | config |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs = r.get("ratio") or r.get("vs_alone") or r.get("vs_limit") or ""
        lines.append(
            f"| {r['case']} | {r['us']} | {r['partial_us']} | {r.get('cold_us', '')} | {r['limit_us']} "
            f"| {r['tbps']} | {r['tflops']} "
            f"| {vs} | `{r['config']}` {r['flags']} |"
        )
    (args.out / f"runtime_{b.limits.arch}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
