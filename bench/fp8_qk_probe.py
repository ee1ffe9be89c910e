"""Where fp8_e4m3_qk's error comes from: the kernel against the fp32 reference (q quantized per row
as the kernel does) over a factorial of what the engine loop and the kernel tests do differently --
the cache's per-layer scale (the tests map the pool's amax onto 448; SGLang's pool without KV
scales stores values at scale 1, where about 1 % of a unit normal's values fall below e4m3's
smallest normal 2^-6), the softmax scale (1/sqrt(576) in the tests, 0.1447 in the loop), and the
prefix -- for both e4m3 modes (fp8_e4m3 dequantizes K, fp8_e4m3_qk runs QK on e4m3 MMAs). Two more
caches isolate the subnormals: scale 1 with every value under 2^-6 set to 0 (no subnormals), and
scale 1 on values times 1/64 (most of them subnormal). Each row: the relative error, the worst
(token, head) row's own relative error, and the largest absolute error.

`--scores` reads the kernel's scores themselves: at P=0 with a mask where each draft node sees only
itself, a row's lse is its one score, scale * q . k. It saves q, the keys and both modes' lse
(scores.pt) and prints each mode's score error against fp32 on q as quantized and as given.

`--analyze scores.pt` (on any machine) recomputes those scores against q quantized with each way
of computing the row's scale -- one rounded division 448 / amax (the kernel's __fdiv_rn), and 448
times the rounded reciprocal (torch's `448 / tensor`) -- and prints the largest difference and how
many scores differ by more than 1e-4.

    python3 bench/fp8_qk_probe.py --out $OUT [--scores]     # on the GPU machine
    python3 bench/fp8_qk_probe.py --analyze OUT/scores.pt
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.reference import make_inputs, reference, rel_error

from tests.kernels.test_fp8_gpu import run_poisoned

CONFIGS = {
    "short": KernelConfig(nsplit=24, ht=8, tk=32, block=256, qt=2, wk=2),  # the engine loop's SHORT range
    "default": KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, pipe=3),  # its long range
}
SHAPES = [(8, 9, [0]), (8, 9, [200]), (8, 9, [46000]), (8, 9, [3000, 0, 129])]
SCALES = {"1/sqrt(576)": 576**-0.5, "0.1447": 0.1447}
SMALLEST_NORMAL = 2.0**-6


def cache(inp, how: str):  # type: ignore[no-untyped-def]
    """The inputs with the cache stored as `how` says (the tests' amax/448, or SGLang's scale 1)."""
    if how == "amax/448":
        return inp
    x = inp.kv_unquantized.float()
    if how == "1, no subnormals":
        x = torch.where(x.abs() < SMALLEST_NORMAL, torch.zeros_like(x), x)
    elif how == "1, values/64":
        x = x / 64
    e4m3 = x.to(torch.float8_e4m3fn)
    pool = e4m3.view(torch.uint8) if inp.kv.dtype == torch.uint8 else e4m3
    return dataclasses.replace(inp, kv=pool, kv_scale=1.0, kv_unquantized=x.to(torch.bfloat16))


def worst_row(out, ref) -> tuple[list[int], float]:  # type: ignore[no-untyped-def]
    """The (b, token, head) row with the largest relative error, and that error."""
    diff = (out.float() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)
    at = int(diff.argmax())
    return [int(i) for i in torch.unravel_index(torch.tensor(at), diff.shape)], float(diff.flatten()[at])


def scores(limits, cubins: Path, out: Path) -> None:  # type: ignore[no-untyped-def]
    """Each mode's scores (lse where a row sees one key) against fp32 scores; saved for analysis."""
    from verify_tuner.kernels.reference import own_scores, quantized_q, score_inputs

    B, Q, H, sm = 64, 9, 8, 0.1447
    saved: dict = {"scale": sm}
    for mode in ("fp8_e4m3", "fp8_e4m3_qk"):
        inp = score_inputs(batch=B, q_len=Q, H=H, seed=7, kv_dtype=mode, scale=sm)
        for name, cfg in CONFIGS.items():
            _, lse = run_poisoned(cfg, inp, limits, cubins, kv_dtype=mode)
            for qname, q in (("q quantized", quantized_q(inp.full_q(), mode)), ("q as given", inp.full_q().float())):
                want = own_scores(inp, q)
                err = (lse - want).abs()
                print(f"{mode} {name} vs {qname}: score err max {err.max():.3e} median {err.median():.3e} "
                      f"(scores' rms {want.pow(2).mean().sqrt():.2f})")  # fmt: skip
            saved[f"lse {mode} {name}"] = lse.cpu()
        saved[f"keys {mode}"] = inp.kv[inp.draft_indices.long()].cpu()
        saved[f"kv_scale {mode}"] = inp.kv_scale
        saved["q"] = inp.full_q().cpu()
    torch.save(saved, out / "scores.pt")


def analyze(path: Path) -> None:
    """The saved kernel scores against fp32 scores on q quantized with each scale formula."""
    saved = torch.load(path)
    q, sm = saved["q"].float(), saved["scale"]
    keys = saved["keys fp8_e4m3_qk"]
    k = (keys.view(torch.float8_e4m3fn) if keys.dtype == torch.uint8 else keys).float() * saved["kv_scale fp8_e4m3_qk"]
    from verify_tuner.kernels.reference import quantized_q

    mul = 448.0 * torch.reciprocal(q.abs().amax(dim=-1, keepdim=True))
    quantized = {"448 / amax, one rounding": quantized_q(q, "fp8_e4m3_qk"),  # the reference's own
                 "448 * (1 / amax), two roundings": (q * mul).to(torch.float8_e4m3fn).float() / mul}  # fmt: skip
    for name, qq in quantized.items():
        want = torch.einsum("bqhd,bqd->bqh", qq, k) * sm
        for cfg in CONFIGS:
            err = (saved[f"lse fp8_e4m3_qk {cfg}"] - want).abs()
            print(f"{cfg}, q scaled by {name}: score err max {err.max():.3e}, "
                  f"{int((err > 1e-4).sum())} of {err.numel()} scores off by more than 1e-4")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--scores", action="store_true", help="the scores alone (P=0, each node seeing itself)")
    ap.add_argument("--analyze", type=Path, help="a scores.pt --scores saved: its scores against each q scale")
    args = ap.parse_args()
    if args.analyze:
        return analyze(args.analyze)
    if args.out is None:
        ap.error("--out is required on the GPU machine")

    import pycuda.autoprimaryctx  # noqa: F401  (torch's primary context)
    from verify_tuner.kernels.build import precompile
    from verify_tuner.kernels.limits import read_device_limits

    torch.cuda.init()
    limits, cubins = read_device_limits(0), Path(tempfile.mkdtemp())
    modes = ("fp8_e4m3", "fp8_e4m3_qk")
    for mode in modes:
        assert not precompile(list(CONFIGS.values()), 9, limits.arch, cubins, kv_dtype=mode)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.scores:
        return scores(limits, cubins, args.out)
    rows = []
    for H, Q, lens in SHAPES:
        for sm_name, sm in SCALES.items():
            for how in ("amax/448", "1", "1, no subnormals", "1, values/64"):
                for mode in modes:
                    inp = cache(make_inputs(prefix_lens=lens, q_len=Q, H=H, seed=7, spare_slots=91, kv_dtype=mode,
                                            scale=sm), how)  # fmt: skip
                    ref, _ = reference(inp)
                    for name, cfg in CONFIGS.items():
                        out, _ = run_poisoned(cfg, inp, limits, cubins, kv_dtype=mode)
                        at, row_err = worst_row(out, ref)
                        row = {"shape": f"H={H} q={Q} P={lens}", "softmax scale": sm_name, "cache scale": how,
                               "mode": mode, "config": name, "rel err": rel_error(out, ref),
                               "worst row (b, token, head)": at, "its rel err": row_err,
                               "abs err max": float((out.float() - ref).abs().max())}  # fmt: skip
                        rows.append(row)
                        print(
                            " | ".join(f"{v:.2e}" if isinstance(v, float) else str(v) for v in row.values()), flush=True
                        )
    doc = {"device": limits.name, "date": dt.date.today().isoformat(), "rows": rows}
    (args.out / f"fp8_qk_probe_{limits.arch}.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
