"""A/B of this tree's kernel against another checkout's (e.g. the previous kernel version), each
at its own heuristic default, same shapes, same inputs, timed the same way (CUDA-graph replays,
inputs rotated past the L2) in one call on the local GPU. Each side's output is checked against
the fp32 reference before it is timed.

    git worktree add /tmp/base dcd2450 && pip wheel --no-deps -w .basewhl /tmp/base   # here
    pip install --no-deps --target /tmp/base-site .basewhl/*.whl                       # there
    python3 bench/ab_versions.py --base-tree /tmp/base-site --base-label v2-dcd2450 --out OUT

The base must be importable as `verify_tuner` from --base-tree: since the namespace move that is
an installed copy (a wheel unpacked with --target), not a checkout; a checkout from before the move
(top-level `kernels`, `tuner`) is not comparable by this script.

The base side runs in a child process with the other tree first on sys.path; it borrows only
this file's timing code (kernels/timing.py of this tree, loaded by path), so both sides share
the clock.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
#: the runtime-split issue's no-regression shapes, then short prefixes (where row splits apply)
SHAPES = [(8, 9, 46000), (16, 9, 46000), (64, 9, 46000), (128, 9, 46000), (8, 1, 131072), (8, 9, 4096)]
SHAPES += [(8, 9, 0), (8, 9, 1218), (8, 9, 2435), (8, 1, 1024)]


def time_defaults(shapes: list[tuple[int, int, int]], cache: str) -> list[dict]:
    """Heuristic default of the tree on sys.path, checked and timed at every shape."""
    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as cuda
    import torch
    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.reference import poisoned_run_error, reference
    from verify_tuner.kernels.timing import rotating_inputs

    spec = importlib.util.spec_from_file_location("_ab_timing", HERE / "kernels" / "timing.py")
    timing = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = timing  # dataclasses look their module up while the class is built
    spec.loader.exec_module(timing)  # type: ignore[union-attr]
    limits = read_device_limits(0)
    stream = cuda.Stream()
    rows = []
    for H, Q, P in shapes:
        cfg = heuristic_config(limits, H=H, q_len=Q, prefix=P)
        sets = rotating_inputs(prefix_lens=[P], q_len=Q, H=H, l2_bytes=limits.l2_bytes, seed=H + Q + P)
        out = torch.empty(1, Q, H, 512, dtype=torch.bfloat16, device="cuda")
        va = VerifyAttention(cfg, H=H, q_len=Q, limits=limits, max_batch=1, cache_dir=Path(cache))

        def launch(k: int, va=va, sets=sets, out=out) -> None:
            va.run(sets[k], out, stream=stream)

        err = poisoned_run_error(lambda launch=launch: launch(0), out, reference(sets[0])[0])
        t = timing.time_graph(launch, len(sets), stream=stream)

        def partial(k: int, va=va, sets=sets, out=out) -> None:  # the partial kernel alone
            va.run(sets[k], out, stream=stream, reduce=False)

        part = timing.time_graph(partial, len(sets), stream=stream)
        rows.append(
            {
                "H": H,
                "Q": Q,
                "prefix": P,
                "config": str(cfg),
                "rel_err": err,
                "us": t.median_us,
                "partial_us": part.median_us,
                "p10_us": t.p10_us,
                "p90_us": t.p90_us,
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        va = sets = launch = None
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--base-tree", type=Path, help="folder where the base's verify_tuner is importable (pip install --target)"
    )
    ap.add_argument("--out", type=Path, help="folder the results are written to (required)")
    ap.add_argument("--cache", default=os.environ.get("TUNER_CACHE_DIR", "/tmp/va-cache"))
    ap.add_argument("--base-label", help="name of the base in the report (default: its git revision)")
    ap.add_argument(
        "--shapes", default=None, help="H:Q:PREFIX,... (default: the no-regression and short-prefix shapes)"
    )
    ap.add_argument("--tag", default="versions", help="the report is ab_TAG_ARCH.{md,json} under --out")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # the shapes as JSON: run the base side
    args = ap.parse_args()
    if args.worker:  # child: the base tree is first on sys.path (so this tree's benchlib is not imported)
        print(json.dumps(time_defaults([tuple(s) for s in json.loads(args.worker)], args.cache + "-base")))
        return
    from benchlib import parse_shapes

    try:
        shapes = parse_shapes(args.shapes) if args.shapes else SHAPES
    except argparse.ArgumentTypeError as e:
        ap.error(f"--shapes: {e}")
    if args.base_tree is None or args.out is None:  # (the worker child takes neither)
        ap.error("--base-tree and --out are required")
    env = {**os.environ, "PYTHONPATH": f"{args.base_tree.resolve()}:{os.environ.get('PYTHONPATH', '')}"}
    child = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(shapes), "--cache", args.cache],
        env=env,
        cwd=args.base_tree,
        capture_output=True,
        text=True,
        check=False,  # its stderr goes into the error below
    )
    if child.returncode != 0:
        raise SystemExit(f"base tree failed:\n{child.stderr[-3000:]}")
    base = json.loads(child.stdout.strip().splitlines()[-1])
    sys.path.insert(0, str(HERE))
    new = time_defaults(shapes, args.cache)
    from verify_tuner.kernels.limits import read_device_limits

    limits = read_device_limits(0)
    rev = (
        args.base_label
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=args.base_tree, capture_output=True, text=True, check=False
        ).stdout.strip()  # not a git checkout: named by its path below
        or str(args.base_tree)
    )
    lines = [
        f"# Kernel A/B: this tree vs {rev} — {limits.name} ({limits.arch}), {dt.date.today().isoformat()}",
        "",
        (
            "Each side at its own heuristic default; µs per partial + reduce pair (and the partial kernel alone), "
            "median of CUDA-graph replays, inputs rotated past the L2; rel. error against the fp32 reference."
        ),
        "",
        (
            "| H | Q | prefix | base µs | base partial µs | base err | new µs | new partial µs | new err | speedup "
            "| base config | new config |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b, n in zip(base, new):
        lines.append(
            f"| {n['H']} | {n['Q']} | {n['prefix']} | {b['us']:.1f} | {b['partial_us']:.1f} | {b['rel_err']:.1e} | "
            f"{n['us']:.1f} | {n['partial_us']:.1f} | {n['rel_err']:.1e} | {b['us'] / n['us']:.2f}x | {b['config']} "
            f"| {n['config']} |"
        )
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"ab_{args.tag}_{limits.arch}"
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"base": base, "new": new, "base_rev": rev}, indent=1))


if __name__ == "__main__":
    main()
