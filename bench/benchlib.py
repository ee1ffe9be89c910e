"""Helpers only the benchmarks use (the product's gate and timing live in verify_tuner.kernels):
the naive-torch baseline, a launcher that stops a benchmark on a wrong result, and interleaved
A/B medians. Run from bench/ scripts (`python3 bench/X.py` puts this folder on sys.path)."""

from __future__ import annotations

import argparse
import statistics
import subprocess
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from verify_tuner.kernels.build import NVCC_FLAGS, SOURCE, nvcc_path, render
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import CompileError, InvalidConfig
from verify_tuner.kernels.reference import Inputs, _visible, poisoned_run_error
from verify_tuner.kernels.shapes import D_QK, D_V
from verify_tuner.kernels.timing import interleave, time_graph

K = TypeVar("K", bound=Hashable)


def naive_torch(inp: Inputs) -> Any:
    """What one writes first (the benchmark's baseline): cuBLAS matmuls + masked softmax, eager."""
    import torch

    B, Q, H, _ = inp.q.shape
    outs = []
    for b in range(B):
        slots, visible = _visible(inp, b)
        k = inp.kv[slots]
        s = (inp.q[b].reshape(Q * H, D_QK) @ k.T).float() * inp.scale
        s = s.view(Q, H, -1).masked_fill(~visible.view(Q, 1, -1), float("-inf"))
        p = torch.softmax(s, dim=-1).to(torch.bfloat16).view(Q * H, -1)
        outs.append((p @ k[:, :D_V]).view(Q, H, D_V))
    return torch.stack(outs)


def checked_launcher(
    va: Any, sets: list[Inputs], out: Any, ref: Any, what: str, *, stream: Any, tol: float = 1e-2
) -> Any:
    """`k -> va.run(sets[k], out)` on `stream` once `va` passed the poisoned-output check on
    sets[0] against `ref`; a wrong result stops the benchmark with `what` and the error (its
    numbers would lie)."""
    err = poisoned_run_error(lambda: va.run(sets[0], out, stream=stream), out, ref)
    if err > tol:
        raise SystemExit(f"WRONG {what}: rel err {err:.3g}")
    return lambda k: va.run(sets[k], out, stream=stream)


def interleaved_medians(
    launchers: Mapping[K, Callable[[int], None]],
    n_sets: int | Mapping[K, int],
    *,
    rounds: int,
    reps: int,
    stream: Any,
    between: Callable[[], None] | None = None,
) -> dict[K, float]:
    """Median over `rounds` interleaved rounds of each launcher's per-round median of `reps`
    CUDA-graph replays (the benchmarks' A/B; the launchers enqueue on `stream`): timed as engines
    run the kernels, without the host's launch cost in the number. `n_sets`: one count, or each
    launcher's own (two formats' inputs rotate past the L2 in different numbers of sets).
    `between`: as in time_graph."""
    keys = list(launchers)
    counts = n_sets if isinstance(n_sets, Mapping) else dict.fromkeys(keys, n_sets)

    def one(k: K) -> float:
        return time_graph(launchers[k], counts[k], stream=stream, replays=reps, between=between).median_us

    per_round = interleave([lambda k=k: one(k) for k in keys], rounds)
    return {k: statistics.median(r) for k, r in zip(keys, per_round)}


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """An argparse type: `H:Q:PREFIX,...` as (H, q_len, prefix) triples."""
    try:
        shapes = [tuple(int(v) for v in item.split(":")) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: shapes are H:Q:PREFIX,... of integers") from None
    if not shapes or any(len(s) != 3 for s in shapes):
        raise argparse.ArgumentTypeError(f"{text!r}: shapes are H:Q:PREFIX,... of three integers each")
    return shapes


def compile_source(
    source: Path, cfg: KernelConfig, q_len: int, arch: str, folder: Path, kv_dtype: str = "bf16", flags: tuple = ()
) -> Path:
    """`cfg` built from another revision's .cu (v6, the tree a profile came from): this tree's
    rendered #defines over its text, with the build's nvcc flags; CompileError says nvcc's first
    error line."""
    line = f'#line 1 "{SOURCE.name}"'
    defines = render(cfg, q_len, kv_dtype).split(line, 1)[0]
    src = folder / f"{source.stem}_{arch}_q{q_len}_{abs(hash((str(cfg), kv_dtype, flags)))}.cu"
    src.write_text(defines + line + "\n" + source.read_text())
    out = src.with_suffix(".cubin")
    cmd = [nvcc_path(), "-cubin", f"-arch={arch}", *NVCC_FLAGS, *flags, "-o", str(out), str(src)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["no message"]
        raise CompileError(
            f"nvcc failed for {arch}: {([ln for ln in lines if 'error' in ln] or lines[-1:])[0].strip()}"
        )
    return out


def parse_config(text: str) -> KernelConfig:
    """A config as printed (`NSPLIT=66 HT=4 ...`); InvalidConfig names what is wrong."""
    items = text.split()
    if not all("=" in item for item in items):
        raise InvalidConfig(f"{text!r}: a config is NAME=VALUE pairs")
    return KernelConfig.from_params(dict(item.split("=", 1) for item in items))
