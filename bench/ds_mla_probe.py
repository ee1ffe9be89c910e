"""Where an fp8_ds_mla result departs from its reference: QK alone (each draft node sees only its own
key, so a row's lse is its one score), PV alone (the same rows' outputs are their own V), and whole
calls with parts of the rows held fixed (the latent's scales 1, the rope dims zero, q's latent or
rope dims zero), each with the error of every 128-dim block of O and the worst rows.

    python3 bench/ds_mla_probe.py [--out DIR]

A diagnostic for the GPU: it prints a table and writes ds_mla_probe.json; it asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FMT = "fp8_ds_mla"
# the format is withheld from serving (its GPU tests fail): this diagnostic runs it on purpose
os.environ.setdefault("VERIFY_TUNER_RUN_WITHHELD", FMT)
DEV = "cuda"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import pycuda.autoprimaryctx  # noqa: F401  (torch's primary context)
    import torch
    from verify_tuner.kernels.config import KernelConfig
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.reference import (
        make_inputs,
        own_scores,
        reference,
        rel_error,
        score_inputs,
    )
    from verify_tuner.kernels.validate import check

    torch.cuda.init()
    limits = read_device_limits(0)
    cache = Path(os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache"))
    configs = {
        "seesaw SF0": KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, pipe=3),
        "fused WK2": KernelConfig(nsplit=7, ht=4, tk=32, block=256, stages=3, wr=2, wk=2, pipe=0),
        "WK1": KernelConfig(nsplit=94, ht=4, tk=16, block=256, stages=2, wr=4, wk=1),
        "WK4": KernelConfig(nsplit=264, ht=8, tk=32, block=256, stages=2, wr=1, wk=4),
    }

    def run(cfg, inp):
        B, Q, H, _ = inp.q.shape
        va = VerifyAttention(cfg, H=H, q_len=Q, limits=limits, max_batch=B, cache_dir=cache, kv_dtype=FMT)
        out = torch.full((B, Q, H, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
        lse = torch.full((B, Q, H), float("nan"), dtype=torch.float32, device=DEV)
        torch.cuda.synchronize()
        va.run(inp, out, lse=lse)
        torch.cuda.synchronize()
        return out, lse

    def rows_of(pool):
        return pool.view(torch.uint8).reshape(-1, 656)

    def set_scales(inp, value):
        kv = inp.kv.clone()
        r = rows_of(kv)
        r[:, 512:528] = torch.full((r.shape[0], 4), value, device=DEV).view(torch.uint8)
        return dataclasses.replace(inp, kv=kv)

    def zero_rope_k(inp):
        kv = inp.kv.clone()
        rows_of(kv)[:, 528:] = 0
        return dataclasses.replace(inp, kv=kv)

    def zero_q(inp, lo, hi):
        q = inp.q.clone()
        q[..., lo:hi] = 0
        return dataclasses.replace(inp, q=q)

    def report(name, cfg_name, out, lse, ref_o, ref_lse):
        blocks = [rel_error(out[..., 128 * i : 128 * (i + 1)], ref_o[..., 128 * i : 128 * (i + 1)]) for i in range(4)]
        per_row = ((out.float() - ref_o).norm(dim=-1) / ref_o.norm(dim=-1).clamp_min(1e-30)).flatten()
        worst = torch.topk(per_row, min(4, per_row.numel()))
        Q, H = out.shape[1:3]
        wrows = [(int(i) // (Q * H), (int(i) // H) % Q, int(i) % H, round(float(v), 3)) for v, i in zip(*worst)]
        lse_row = (lse - ref_lse).abs().flatten()
        # a factor the kernel's lse carries against the reference's (scores cases: lse is the score)
        k, r = lse.flatten().double(), ref_lse.flatten().double()
        slope = float((k * r).sum() / (r * r).sum().clamp_min(1e-30))
        corr = float(torch.corrcoef(torch.stack([k, r]))[0, 1])
        row = {
            "case": name, "config": cfg_name, "out": rel_error(out, ref_o), "lse": rel_error(lse, ref_lse),
            "blocks": blocks, "worst_rows_b_node_head_err": wrows,
            "rows_over_1e-2": int((per_row > 1e-2).sum()), "rows": per_row.numel(),
            "lse_abs_max": float(lse_row.max()), "lse_slope": slope, "lse_corr": corr,
        }  # fmt: skip
        print(
            f"| {name:<28} | {cfg_name:<10} | {row['out']:.2e} | {row['lse']:.2e} | "
            + " ".join(f"{b:.1e}" for b in blocks)
            + f" | {slope:.4f} {corr:.4f} | {row['rows_over_1e-2']}/{row['rows']} | {wrows[:2]} |"
        )
        return row

    from verify_tuner.kernels.build import precompile

    pool = [c for c in configs.values() if check(c, limits, H=8, q_len=9, kv_dtype=FMT) is None]
    assert not precompile(pool, 9, limits.arch, cache, kv_dtype=FMT)
    print(
        "| case | config | out err | lse err | O blocks 0..3 | lse slope, corr | rows > 1e-2 | worst (b, node, head, err) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    results = []
    base_scores = score_inputs(batch=2, q_len=9, H=8, seed=3, kv_dtype=FMT, scale=576**-0.5, device=DEV)
    full = make_inputs(prefix_lens=[300, 40], q_len=9, H=8, seed=4, spare_slots=20, kv_dtype=FMT, device=DEV)
    cases = {
        "scores": base_scores,
        "scores, scales 1": set_scales(base_scores, 1.0),
        "scores, K rope 0": zero_rope_k(base_scores),
        "scores, q rope 0": zero_q(base_scores, 512, 576),
        "scores, q latent 0": zero_q(base_scores, 0, 512),
        "scores, scales 1, K rope 0": zero_rope_k(set_scales(base_scores, 1.0)),
        "full": full,
        "full, scales 1": set_scales(full, 1.0),
        "full, scales 1, K rope 0": zero_rope_k(set_scales(full, 1.0)),
        "full, q latent 0": zero_q(full, 0, 512),
        "full, q rope 0": zero_q(full, 512, 576),
    }
    for cname, cfg in configs.items():
        for name, inp in cases.items():
            Q, H = inp.q.shape[1:3]
            if check(cfg, limits, H=H, q_len=Q, kv_dtype=FMT) is not None:
                continue
            ref_o, ref_lse = reference(inp)
            if name.startswith("scores"):
                own = own_scores(inp, inp.full_q())
                assert torch.allclose(ref_lse, own, rtol=1e-4, atol=1e-4)
            try:
                out, lse = run(cfg, inp)
            except Exception as exc:  # noqa: BLE001  (a diagnostic: note the failure and go on)
                print(f"| {name} | {cname} | failed: {exc!s:.200} |")
                results.append({"case": name, "config": cname, "error": str(exc)})
                continue
            results.append(report(name, cname, out, lse, ref_o, ref_lse))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ds_mla_probe.json").write_text(
            json.dumps({"device": torch.cuda.get_device_name(0), "rows": results}, indent=1)
        )


if __name__ == "__main__":
    main()
