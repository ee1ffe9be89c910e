"""A/B of two compile-flag variants of the kernel on the local GPU, same configs, same inputs,
interleaved rounds (so clock drift hits both alike); each variant's output is checked against
the fp32 reference first, at the timed shape and at a ragged batch (parts that cross requests,
an empty prefix: the code a single request never reaches). Configs: the heuristic default of
each shape.

    python3 bench/ab_kernel.py --b-flags=-DVA_NO_PDL --label "reduce: PDL (A) vs plain launch (B)" --out DIR
    python3 bench/ab_kernel.py --kv-dtype fp8_e4m3 --b-flags=-DVA_F8_BITS --label "e4m3: cvt (A) vs bit placement (B)" --out DIR
    git show HEAD~3:kernels/csrc/verify_attention.cu > /tmp/base.cu
    python3 bench/ab_kernel.py --a-source /tmp/base.cu --label "HEAD~3 (A) vs this tree (B)" --out DIR
    python3 bench/ab_kernel.py --batch 4 --shapes 8:9:1000 --b-flags=-DVA_TILED_PLAN=0 --label "..." --out DIR

`--batch B` times each shape as B requests of that prefix (a short batch's plan); the default is
one request.

A -D flag must name a macro the kernel source tests: a misspelt or removed one would silently
compare A with A, so it is refused, and so is a VA_F8_* flag (the e4m3 conversion's) on a cache
that is not e4m3.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import parse_config, parse_shapes
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.build import SOURCE
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import CompileError, InvalidConfig
from verify_tuner.kernels.formats import kv_format, readable
from verify_tuner.kernels.limits import known_device
from verify_tuner.kernels.reference import SLOT_LAYOUTS
from verify_tuner.kernels.shapes import D_V
from verify_tuner.kernels.timing import check_neighbour_mb
from verify_tuner.kernels.validate import check

SHAPES = [(8, 9, 46000), (8, 1, 131072), (64, 9, 46000), (16, 9, 16384), (128, 1, 46000), (8, 9, 4096)]
#: The ragged batch each variant is also gated at: one part's segments span several requests, one
#: request has no prefix, one ends mid-tile.
GATE_BATCH = [1000, 0, 37, 3000]
ROUNDS, REPS = 5, 10


def config_arg(text: str) -> KernelConfig:
    try:
        return parse_config(text)
    except InvalidConfig as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def override_arg(text: str) -> dict[str, int]:
    """Constants replaced in each shape's default, as 'WR=1 WK=2'."""
    items = text.split()
    if not items or not all("=" in item for item in items):
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=VALUE pairs, e.g. 'WR=1 WK=2'")
    known = {f.name for f in dataclasses.fields(KernelConfig)}
    out = {}
    for item in items:
        name, value = item.split("=", 1)
        if name.lower() not in known:
            raise argparse.ArgumentTypeError(f"{name}: not a constant ({', '.join(sorted(k.upper() for k in known))})")
        try:
            out[name.lower()] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item}: the value must be an integer") from None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a-flags", default="", help="nvcc flags of variant A, one string (write --a-flags=-DX)")
    ap.add_argument("--b-flags", default="", help="nvcc flags of variant B, one string (write --b-flags=-DX)")
    ap.add_argument(
        "--b-config",
        type=config_arg,
        help="variant B's config as 'NSPLIT=66 HT=4 ...' (default: the heuristic default, as A)",
    )
    ap.add_argument(
        "--b-override",
        type=override_arg,
        help="variant B is each shape's default with these constants replaced, as 'WR=1 WK=2' "
        "(a structure A/B across shapes whose defaults differ in NSPLIT)",
    )
    ap.add_argument(
        "--defaults-of",
        metavar="DEVICE",
        help="time another known device's heuristic defaults (e.g. rtx-pro-6000: a structure check of its "
        "configs, which must also run here) instead of this GPU's",
    )
    ap.add_argument(
        "--a-source",
        type=Path,
        help="build variant A from another revision's verify_attention.cu (launched through this tree's runtime)",
    )
    ap.add_argument(
        "--batch", type=int, default=1, help="requests of each shape's prefix in the timed batch (default 1)"
    )
    ap.add_argument("--label", default="A vs B")
    ap.add_argument("--kv-dtype", default="bf16", help="the cache format both variants read (kernels/formats.py)")
    ap.add_argument(
        "--layout",
        choices=SLOT_LAYOUTS,
        default="scattered",
        help="the timed inputs' slots: a random permutation of the pool (default) or each request's in pool order",
    )
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument("--cache", default=os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache"))
    ap.add_argument(
        "--shapes",
        type=parse_shapes,
        default=SHAPES,
        help="H:Q:PREFIX,... (default: the six no-regression shapes)",
    )
    ap.add_argument(
        "--neighbour-mb",
        type=int,
        default=0,
        help="follow every launch with a bf16 GEMM streaming this many MB of weights, as the rest of "
        "an engine's layer (cold caches); its own time is subtracted, so give more than the L2 (e.g. 128 on "
        "an H200) for a GEMM whose time does not depend on what ran before it (default 0: back-to-back replays)",
    )
    args = ap.parse_args()
    if args.batch < 1:
        ap.error(f"--batch {args.batch}: a batch holds at least one request")
    try:
        check_neighbour_mb(args.neighbour_mb)
        readable(args.kv_dtype)
    except (ValueError, InvalidConfig) as exc:
        ap.error(str(exc))
    if args.b_config and args.b_override:
        ap.error("--b-config and --b-override both set B's config: give one")
    b_text = ""
    if args.b_config:
        b_text = f" (B: `{args.b_config}`)"
    elif args.b_override:
        b_text = f" (B: the default with `{' '.join(f'{k.upper()}={v}' for k, v in args.b_override.items())}`)"
    defaults_of = None
    if args.defaults_of:
        defaults_of = known_device(args.defaults_of)
        if defaults_of is None:
            ap.error(f"--defaults-of {args.defaults_of!r}: not a known device (kernels/limits.py)")
    variants = {"A": tuple(args.a_flags.split()), "B": tuple(args.b_flags.split())}
    if args.a_source is not None and not args.a_source.is_file():
        ap.error(f"--a-source {args.a_source}: no such file")
    sources = {"A": (args.a_source or SOURCE).read_text(), "B": SOURCE.read_text()}
    for name_v, flags in variants.items():
        for flag in (f for f in flags if f.startswith("-D")):
            name = flag[2:].split("=", 1)[0]
            if not re.search(rf"\b{re.escape(name)}\b", sources[name_v]):  # a prefix of a tested macro is not tested
                raise SystemExit(f"{flag}: the kernel source never tests {name}; the A/B would compare A with A")
            if name.startswith("VA_F8_") and kv_format(args.kv_dtype).element != "e4m3":
                raise SystemExit(
                    f"{flag} changes e4m3 builds only: pass --kv-dtype fp8_e4m3, or the A/B compares A with A"
                )

    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as cuda
    import torch
    from benchlib import checked_launcher, interleaved_medians
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.reference import reference
    from verify_tuner.kernels.timing import neighbour_gemm, rotating_inputs

    limits, stream = read_device_limits(0), cuda.Stream()
    lines = [
        (
            f"# Kernel A/B: {args.label} — {limits.name} ({limits.arch}), {dt.date.today().isoformat()}, "
            f"kv_dtype {args.kv_dtype}, {args.layout} slots"
            + (f", batches of {args.batch} requests" if args.batch > 1 else "")
        ),
        "",
        (
            (
                f"A built from `{args.a_source}` (sha256 {hashlib.sha256(sources['A'].encode()).hexdigest()[:12]}). "
                if args.a_source
                else ""
            )
            + f"A flags: `{' '.join(variants['A']) or '(none)'}`; B flags: `{' '.join(variants['B']) or '(none)'}`. "
            f"Median over {ROUNDS} interleaved rounds of the per-round median of {REPS} CUDA-graph replays, inputs rotated "
            "past the L2; config = the heuristic default"
            + (f" of {defaults_of.name} (a structure check: its configs run here)" if defaults_of else "")
            + b_text
            + "."
            + (
                f" Every launch is followed by a bf16 GEMM over {args.neighbour_mb} MB of weights (the rest of a layer: "
                "cold instruction and data caches), whose own time is subtracted."
                if args.neighbour_mb
                else ""
            )
        ),
        "",
        (
            "| H | Q | prefix | config | A µs | B µs | B/A | A partial µs | B partial µs | partial B/A "
            "| A reduce µs | B reduce µs |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for H, Q, P in args.shapes:
        cfg = heuristic_config(defaults_of or limits, H=H, q_len=Q, prefix=P, kv_dtype=args.kv_dtype)
        if defaults_of is not None and (why := check(cfg, limits, H=H, q_len=Q, kv_dtype=args.kv_dtype)):
            raise SystemExit(f"{defaults_of.name}'s default {cfg} does not run on {limits.name}: {why}")
        b_cfg = dataclasses.replace(cfg, **args.b_override) if args.b_override else args.b_config or cfg
        cfgs = {"A": cfg, "B": b_cfg}
        sets = rotating_inputs(
            prefix_lens=[P] * args.batch,
            q_len=Q,
            H=H,
            l2_bytes=limits.l2_bytes,
            seed=H + Q + P,
            kv_dtype=args.kv_dtype,
            layout=args.layout,
        )
        ref = reference(sets[0])[0]
        out = torch.empty(args.batch, Q, H, D_V, dtype=torch.bfloat16, device="cuda")
        vas = {
            name: _variant(cfgs[name], H, Q, limits, args, name, flags, max_batch=args.batch)
            for name, flags in variants.items()
        }
        launchers = {
            name: checked_launcher(
                va, sets, out, ref, f"variant {name} at H={H} Q={Q} P={P} {cfgs[name]}", stream=stream
            )
            for name, va in vas.items()
        }
        _gate_batch(cfgs, variants, H, Q, limits, args, stream)
        # each kernel alone too: a layout change of the partial moved the step past it more than
        # the partial itself, with and without PDL (bench/results/ab_kernel_flags_sm_90.md)
        for name, va in vas.items():
            launchers[name + " partial"] = _kernel_launcher(va, sets, out, stream, reduce=False)
            launchers[name + " reduce"] = _kernel_launcher(va, sets, out, stream, partial=False)
        between = neighbour_gemm(args.neighbour_mb) if args.neighbour_mb else None
        if between is not None:
            launchers["neighbour"] = lambda k: None
        med = interleaved_medians(launchers, len(sets), rounds=ROUNDS, reps=REPS, stream=stream, between=between)
        if between is not None:
            alone = med.pop("neighbour")
            med = {k: v - alone for k, v in med.items()}
        a, b, ap, bp, ar, br = (med[k] for k in ("A", "B", "A partial", "B partial", "A reduce", "B reduce"))
        lines.append(
            f"| {H} | {Q} | {P if args.batch == 1 else f'{P}×{args.batch}'} | {cfg} | {a:.1f} | {b:.1f} | {b / a:.3f} | {ap:.1f} | {bp:.1f} | {bp / ap:.3f} "
            f"| {ar:.1f} | {br:.1f} |"
        )
        print(lines[-1], flush=True)
        sets = []
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    slug = "".join(ch if ch.isalnum() else "_" for ch in args.label.lower())
    if len(slug) > 40:  # labels that share their first 40 characters must not overwrite each other
        slug = slug[:32].strip("_") + "_" + hashlib.sha256(args.label.encode()).hexdigest()[:7]
    (args.out / f"ab_{slug}_{limits.arch}.md").write_text("\n".join(lines) + "\n")


def _gate_batch(cfgs, variants, H, Q, limits, args, stream) -> None:
    """Each variant's output at GATE_BATCH against the fp32 reference (SystemExit if wrong)."""
    import torch
    from benchlib import checked_launcher
    from verify_tuner.kernels.reference import make_inputs, reference

    inp = make_inputs(prefix_lens=GATE_BATCH, q_len=Q, H=H, seed=H + Q, spare_slots=55, kv_dtype=args.kv_dtype)
    ref = reference(inp)[0]
    out = torch.empty(len(GATE_BATCH), Q, H, D_V, dtype=torch.bfloat16, device="cuda")
    for name, flags in variants.items():
        va = _variant(cfgs[name], H, Q, limits, args, name, flags, max_batch=len(GATE_BATCH))
        checked_launcher(va, [inp], out, ref, f"variant {name} at H={H} Q={Q} batch {GATE_BATCH} {cfgs[name]}",
                         stream=stream)  # fmt: skip


def _variant(cfg, H, Q, limits, args, name, flags, *, max_batch):
    """Variant `name`'s launcher: this tree's kernel with `flags`, or for A with --a-source, that
    source's build at the same config, loaded into this tree's runtime."""
    import tempfile

    from benchlib import compile_source
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.runtime import CubinKernels

    va = VerifyAttention(
        cfg, H=H, q_len=Q, limits=limits, max_batch=max_batch, cache_dir=Path(args.cache),
        extra_flags=flags, kv_dtype=args.kv_dtype,
    )  # fmt: skip
    if name == "A" and args.a_source is not None:
        with tempfile.TemporaryDirectory(prefix="ab-a-") as tmp:
            try:
                cubin = compile_source(args.a_source, cfg, Q, limits.arch, Path(tmp), args.kv_dtype, flags)
            except CompileError as e:  # e.g. a revision from before this cache format
                raise SystemExit(f"--a-source {args.a_source} does not build {cfg} ({args.kv_dtype}): {e}") from None
            va.kernels = CubinKernels(cubin.read_bytes(), va.spec, sm_count=limits.sm_count)
    return va


def _kernel_launcher(va, sets, out, stream, *, reduce=True, partial=True):
    """`k -> one kernel alone on sets[k]` (the pair's output was checked; the reduce alone merges
    the partials the last launch left, which for one shape's sets have the same plan)."""
    return lambda k: va.run(sets[k], out, stream=stream, reduce=reduce, partial=partial)


if __name__ == "__main__":
    main()
