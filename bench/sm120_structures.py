"""The sm_120 template as a structure check on the local GPU: configs valid on the RTX PRO 6000
(99 KB of shared memory a block, a subset of the H200's limits), each with the NSPLIT the
heuristic would give it there (one wave of 188 SMs), timed here against the sm_120 heuristic
default of the same shape, in the same call: what each would be as the sm_120 default, run on
this GPU. This is not sm_120 speed: the cubins are this GPU's, its SM count, clocks, caches and
bandwidth are not sm_120's.

Every config is gated against the fp32 reference before it is timed (CUDA-graph replays, inputs
rotated past the L2, interleaved rounds). Writes sm120_structures_<arch>.json and .md under --out.
With --kv-dtype the cache and every build are that format's (fp8_e4m3: its ring holds half bf16's
bytes a row, so 32-token tiles fit sm_120's 99 KB), against that format's own sm_120 default (bf16's
default structure among the candidates), and the files are named after it.

    python3 bench/sm120_structures.py --out OUT [--sample 40]      # on the GPU machine
    python3 bench/sm120_structures.py --kv-dtype fp8_e4m3 --out OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import parse_config
from verify_tuner import space
from verify_tuner.heuristic import heuristic_config, one_wave_nsplit
from verify_tuner.kernels.limits import known_device
from verify_tuner.kernels.validate import check

SHAPES = [("H=8 q=9 P=46000", 8, 9, 46000), ("H=64 q=9 P=46000", 64, 9, 46000), ("H=8 q=64 P=46000", 8, 64, 46000)]
TARGET = known_device("rtx-pro-6000")


def shape_of(c, q: int) -> tuple[bool, int]:
    """(QK's row tiles shared evenly over its row groups, independent accumulators a QK warp)."""
    nr = -(-c.ht * (c.qt or q) // 8)
    group_warps = c.block // 32 // (2 if c.pipe == 3 else 1)
    per_warp_tiles = (c.tk // 16) // (group_warps // (c.wr * c.wk))
    return nr % c.wr == 0, per_warp_tiles * -(-nr // c.wr)


def file_stem(kv_dtype: str) -> str:
    """sm120_structures, or sm120_structures_<format> for another cache format."""
    return "sm120_structures" + ("" if kv_dtype == "bf16" else f"_{kv_dtype}")


def structures(H: int, q: int, n: int, seed: int, kv_dtype: str = "bf16", extra: tuple = ()) -> tuple[object, list]:
    """(the format's sm_120 default, structures valid on sm_120 for the format's build, with sm_120's
    one-wave NSPLIT): the default's, for another format bf16's default structure too, up to n/2 with
    balanced row tiles and >= 4 accumulators a warp (the issue's template), the rest drawn from the
    others; `extra` structures (any NSPLIT) are timed too where they are valid for the shape."""
    rng = random.Random(seed)
    default = heuristic_config(TARGET, H=H, q_len=q, prefix=46000, kv_dtype=kv_dtype)
    bf16 = heuristic_config(TARGET, H=H, q_len=q, prefix=46000)
    valid = [c for c in space.valid_configs(TARGET, H=H, q_len=q, kv_dtype=kv_dtype) if c.nsplit == 1]
    good = [c for c in valid if shape_of(c, q)[0] and shape_of(c, q)[1] >= 4]
    good = rng.sample(good, min(len(good), n // 2))
    rest = [c for c in valid if c not in good]
    wanted = [dataclasses.replace(c, nsplit=1) for c in extra]
    wanted = [c for c in wanted if check(c, TARGET, H=H, q_len=q, kv_dtype=kv_dtype) is None]
    first = [dataclasses.replace(c, nsplit=1) for c in dict.fromkeys((default, bf16))] + wanted
    picked = dict.fromkeys([*first, *good, *rng.sample(rest, n - len(good))])
    return default, [
        dataclasses.replace(c, nsplit=one_wave_nsplit(c, TARGET, H=H, q_len=q, kv_dtype=kv_dtype)) for c in picked
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sample", type=int, default=40, help="structures a shape besides the default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache")))
    ap.add_argument("--kv-dtype", default="bf16", help="the cache format every config reads")
    ap.add_argument("--config", type=parse_config, action="append", default=[],
                    help="a structure to time too, where valid (repeatable; NSPLIT is sm_120's one-wave one)")  # fmt: skip
    args = ap.parse_args()
    kv = args.kv_dtype
    stem = file_stem(kv)

    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as cuda
    import torch
    from benchlib import checked_launcher, interleaved_medians
    from verify_tuner.kernels.build import precompile
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.reference import reference
    from verify_tuner.kernels.timing import rotating_inputs

    limits, stream, rows = read_device_limits(0), cuda.Stream(), []
    args.out.mkdir(parents=True, exist_ok=True)
    for name, H, q, P in SHAPES:
        default, pool = structures(H, q, args.sample, args.seed, kv, tuple(args.config))
        pool = [default, *(c for c in pool if c != default)]
        failed = precompile(pool, q, limits.arch, args.cache, kv_dtype=kv)
        pool = [c for c in pool if not any(f.startswith(f"{c}:") for f in failed)]
        sets = rotating_inputs(prefix_lens=[P], q_len=q, H=H, l2_bytes=limits.l2_bytes, seed=H + q, kv_dtype=kv)
        ref, out = reference(sets[0])[0], torch.empty(1, q, H, 512, dtype=torch.bfloat16, device="cuda")
        got = {}
        for cfg in pool:
            va = VerifyAttention(cfg, H=H, q_len=q, limits=limits, max_batch=1, cache_dir=args.cache, kv_dtype=kv)
            got[str(cfg)] = checked_launcher(va, sets, out, ref, f"{name} {cfg}", stream=stream)
        us = interleaved_medians(got, len(sets), rounds=args.rounds, reps=10, stream=stream)
        base = us[str(default)]
        for cfg, t in sorted(us.items(), key=lambda kv: kv[1]):
            rows.append({"shape": name, "config": cfg, "us": round(t, 2), "vs_sm120_default": round(t / base, 3),
                         "sm120_default": cfg == str(default)})  # fmt: skip
        best = min(us, key=us.get)
        print(f"{name:18s} default {base:8.1f} us  best {us[best]:8.1f} ({us[best] / base:.3f}x)  {best}", flush=True)
        doc = {"device": limits.name, "date": dt.date.today().isoformat(), "target": TARGET.name,
               "kv_dtype": kv, "rows": rows}  # fmt: skip
        (args.out / f"{stem}_{limits.arch}.json").write_text(json.dumps(doc, indent=1) + "\n")
        del sets, got
        torch.cuda.empty_cache()
    title = f"# sm_120-valid structures timed on {limits.name} ({dt.date.today()}), {kv}"
    lines = [f"{title}: a structure check, not sm_120 speed",
             "", "| shape | µs | × sm_120 default | config |", "|---|---|---|---|"]  # fmt: skip
    for shape in dict.fromkeys(r["shape"] for r in rows):
        mine = [r for r in rows if r["shape"] == shape]
        for r in mine[:8] + [r for r in mine[8:] if r["sm120_default"]]:
            tag = " (sm_120 default)" if r["sm120_default"] else ""
            lines.append(f"| {shape} | {r['us']} | {r['vs_sm120_default']} | `{r['config']}`{tag} |")
    (args.out / f"{stem}_{limits.arch}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
