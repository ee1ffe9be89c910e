"""Which configs an e4m3 cache (kv_dtype fp8_e4m3) wants, against bf16's default in the same call:
for each headline shape, the bf16 heuristic's config on a bf16 cache (and its grid with one QK row
group, where valid) and, on the e4m3 cache, e4m3's own default, its other warp grids and blocks an
SM, and the bf16 config's neighbours in ring depth (STAGES), tile (TK) and pipeline (PIPE) that
validate() accepts. Each is gated against the fp32 reference (on the dequantized cache for e4m3)
before it is timed; CUDA-graph replays, inputs rotated past the L2, interleaved rounds. Writes
fp8_configs_<arch>.json and .md under --out. The e4m3 build dequantizes in registers, so its ring
holds half bf16's bytes a row: deeper rings and larger tiles fit than on a bf16 cache.

    python3 bench/fp8_configs.py --out OUT        # on the GPU machine
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify_tuner.heuristic import BANDWIDTH_ROWS, blocks_per_sm, heuristic_config
from verify_tuner.kernels.validate import check

B32 = [20000 + round(50000 * i / 31) for i in range(32)]  # 20k..70k
SHAPES = [("H=8 q=1 P=131072", 8, 1, [131072]), ("H=8 q=9 P=46000", 8, 9, [46000]), ("B=32 20k..70k", 8, 9, B32)]
FMT = "fp8_e4m3"


#: At most this many configs a shape (the bf16 default first).
MAX_CANDIDATES = 24
#: QK warp grids (row groups WR x k-slices WK) tried around e4m3's own default: WR row groups each
#: dequantize the same K fragments, so fewer row groups convert fewer bytes a tile, at the cost of
#: more row tiles' accumulators a warp.
GRIDS = ((1, 2), (1, 4), (2, 2), (2, 1), (4, 1), (1, 1))


def candidates(limits, H: int, q: int, lens: list[int]) -> list:
    """The bf16 default, e4m3's own default where it differs (the halved ring lets it keep a score
    buffer per k-slice, SF=0), the own default's other warp grids and score folds, and, for a
    bandwidth-mode default (few rows), one to four blocks an SM of it and of the bf16 default where
    they fit (the halved ring and the register dequantization's few registers let more of them
    share an SM; fewer blocks halve the split-KV merge's partials); then the bf16 default's valid
    neighbours on an e4m3 cache in ring depth, tile and pipeline. At most MAX_CANDIDATES, the bf16
    default first."""
    base = heuristic_config(limits, H=H, q_len=q, prefix=max(lens), batch=len(lens))
    own = heuristic_config(limits, H=H, q_len=q, prefix=max(lens), batch=len(lens), kv_dtype=FMT)
    out = [base] + [own] * (own != base)

    def add(c) -> None:
        if c not in out and check(c, limits, H=H, q_len=q, kv_dtype=FMT) is None:
            out.append(c)

    for wr, wk in GRIDS:
        for sf in (0, 1):
            add(dataclasses.replace(own, wr=wr, wk=wk, sf=sf))
    if own.ht * own.row_tile(q) <= BANDWIDTH_ROWS:
        for c in (own, base):
            room = blocks_per_sm(c, q, limits, FMT)  # (registers estimated: ptxas may allow fewer)
            for per_sm in range(1, min(room, 4) + 1):
                add(dataclasses.replace(c, nsplit=per_sm * limits.sm_count))
    for stages in (2, 3, 4, 6):
        for tk in (32, 64, 128):
            for pipe in (0, 1, 3):
                add(dataclasses.replace(base, stages=stages, tk=tk, pipe=pipe))
    return out[:MAX_CANDIDATES]


def bf16_candidates(limits, H: int, q: int, base) -> list:
    """bf16's default and, where valid, its grid with one row group (each K fragment loaded once a
    tile instead of once a row group): the same structure change on the cache it does not dequantize."""
    one = dataclasses.replace(base, wr=1, wk=2)
    return [base] + [one] * (one != base and check(one, limits, H=H, q_len=q) is None)


def file_stem(arch: str) -> str:
    """The results' file name without its suffix."""
    return f"fp8_configs_{arch}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache")))
    args = ap.parse_args()

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
    for name, H, q, lens in SHAPES:
        pool = candidates(limits, H, q, lens)
        own = heuristic_config(limits, H=H, q_len=q, prefix=max(lens), batch=len(lens), kv_dtype=FMT)
        served = {"bf16": str(pool[0]), FMT: str(own)}  # each format's own default config
        plain = bf16_candidates(limits, H, q, pool[0])
        precompile(plain, q, limits.arch, args.cache)
        precompile(pool, q, limits.arch, args.cache, kv_dtype=FMT)
        got, keep = {}, []
        for kv in ("bf16", FMT):
            sets = rotating_inputs(prefix_lens=lens, q_len=q, H=H, l2_bytes=limits.l2_bytes, seed=H + q, kv_dtype=kv)
            ref, out = reference(sets[0])[0], torch.empty(len(lens), q, H, 512, dtype=torch.bfloat16, device="cuda")
            keep.append((sets, out))
            for cfg in plain if kv == "bf16" else pool:
                va = VerifyAttention(cfg, H=H, q_len=q, limits=limits, max_batch=len(lens), cache_dir=args.cache,
                                     kv_dtype=kv)  # fmt: skip
                got[(kv, str(cfg))] = checked_launcher(va, sets, out, ref, f"{name} {kv} {cfg}", stream=stream)
        n = min(len(s) for s, _ in keep)
        us = interleaved_medians(got, n, rounds=args.rounds, reps=20, stream=stream)
        bf16 = us[("bf16", str(pool[0]))]
        for (kv, cfg), t in sorted(us.items(), key=lambda kv_t: kv_t[1]):
            rows.append({"shape": name, "kv_format": kv, "config": cfg, "us": round(t, 2),
                         "vs_bf16_default": round(t / bf16, 3), "default": cfg == served[kv]})  # fmt: skip
            print(f"{name:18s} {kv:9s} {t:8.1f} us {t / bf16:6.3f}x  {cfg}", flush=True)
        del keep, got
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"device": limits.name, "date": dt.date.today().isoformat(), "rows": rows}
    stem = file_stem(limits.arch)
    (args.out / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    title = f"# e4m3 cache configs vs bf16's default on {limits.name} ({doc['date']})"
    lines = [title, "",
             "| shape | kv | µs | × bf16 default | config |", "|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['shape']} | {r['kv_format']} | {r['us']} | {r['vs_bf16_default']} | `{r['config']}`"
              f"{' (default)' if r['default'] else ''} |" for r in rows]  # fmt: skip
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
