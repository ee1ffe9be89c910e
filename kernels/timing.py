"""Timing rules shared by the benchmark and the tuner (GPU path; torch + PyCUDA events).

CUDA events around each launch pair, warm-up first, median of >= 30 runs with p10/p90, and the
inputs rotated over enough sets that their KV exceeds the L2, so no config wins from cache.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from verify_tuner.kernels.formats import ITEMSIZE, kv_format
from verify_tuner.kernels.reference import Inputs, make_inputs


@dataclass(frozen=True)
class Timing:
    median_us: float
    p10_us: float
    p90_us: float
    samples: list[float]


def summarize(samples: list[float]) -> Timing:
    s = sorted(samples)
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) >= 2 else [s[0]] * 9
    return Timing(statistics.median(s), q[0], q[-1], samples)


def rotating_inputs(
    *,
    prefix_lens: list[int],
    q_len: int,
    H: int,
    l2_bytes: int,
    seed: int = 0,
    max_sets: int = 64,
    layout: str = "scattered",
    kv_dtype: str = "bf16",
) -> list[Inputs]:
    """Input sets whose KV together exceed 3x the L2 (at least 2 sets)."""
    per_set = (sum(prefix_lens) + len(prefix_lens) * q_len) * kv_format(kv_dtype).row_bytes
    n = max(2, min(max_sets, -(-3 * max(l2_bytes, 1) // max(per_set, 1))))
    return [
        make_inputs(prefix_lens=prefix_lens, q_len=q_len, H=H, seed=seed + k, layout=layout, kv_dtype=kv_dtype)
        for k in range(n)
    ]


def time_launches(
    launch: Callable[[int], None], n_sets: int, *, reps: int = 50, warmup: int = 5, stream: Any = None
) -> Timing:
    """Time `launch(k)` (k = input set) with events, rotating k; returns microseconds."""
    import pycuda.driver as cuda

    for k in range(warmup):
        launch(k % n_sets)
    pairs = [(cuda.Event(), cuda.Event()) for _ in range(reps)]
    for i, (start, stop) in enumerate(pairs):
        start.record(stream)
        launch((warmup + i) % n_sets)
        stop.record(stream)
    pairs[-1][1].synchronize()
    return summarize([stop.time_since(start) * 1000.0 for start, stop in pairs])


def graph_shape(
    est_us: float, n_sets: int, *, replays: int, min_launches: int, budget_us: float | None
) -> tuple[int, int]:
    """(launches per graph, replays) for a kernel estimated at `est_us` a launch. Without a budget:
    every set in turn repeated to `min_launches`, `replays` times. With one, a long kernel needs
    fewer launches to hide the replay's own cost (a graph of about a millisecond) and fewer replays
    to be timed well (the budget's worth, at least 5): a config 100x slower than the best is not
    worth 700 launches, and a study's batched keys are full of them."""
    if budget_us is None or est_us <= 0:
        return max(n_sets, min_launches), replays
    launches = min(max(n_sets, min_launches), max(n_sets, -(-1000 // max(int(est_us), 1))))
    return launches, max(5, min(replays, int(budget_us / (launches * est_us))))


def time_graph(
    launch: Callable[[int], None],
    n_sets: int,
    *,
    stream: Any,
    replays: int = 15,
    min_launches: int = 24,
    budget_us: float | None = None,
    between: Callable[[], None] | None = None,
) -> Timing:
    """Time `launch(k)` the way an inference server runs it: captured in one CUDA graph (every
    input set in turn, repeated to at least `min_launches` launches), replayed `replays` times
    between events. One sample = one replay's time / its launches, in microseconds. With
    `budget_us`, the graph and the replays shrink for long kernels (graph_shape) after one timed
    pass over the sets.

    `launch` must enqueue on `stream` (a PyCUDA stream); torch captures it through an external
    stream, so PyCUDA and driver launches (the PDL reduce) land in the graph alike.

    `between()`, when given, is enqueued after every launch (torch work on the current stream,
    which is `stream` here): the rest of an engine's layer, whose code and data leave the kernel's
    caches cold as a real forward pass does, where back-to-back replays keep its instructions warm.
    Its own time is in the samples: time it with a `launch` that enqueues nothing and subtract."""
    import torch

    ext = torch.cuda.ExternalStream(stream.handle)

    def step(k: int) -> None:
        launch(k)
        if between is not None:
            between()

    est_us = _warm_up(step, n_sets, ext, timed=budget_us is not None)
    launches, replays = graph_shape(est_us, n_sets, replays=replays, min_launches=min_launches, budget_us=budget_us)
    order = [k % n_sets for k in range(launches)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=ext):
        for k in order:
            step(k)
    graph.replay()
    torch.cuda.synchronize()
    samples = [us / len(order) for us in _replay_times(graph, replays)]
    del graph
    return summarize(samples)


def _warm_up(step: Callable[[int], None], n_sets: int, ext: Any, *, timed: bool) -> float:
    """Every set launched once outside the capture (modules loaded, inputs touched); with `timed`,
    a second pass timed with events: its µs a launch (0 otherwise), what graph_shape sizes by."""
    import torch

    with torch.cuda.stream(ext):
        for k in range(n_sets):
            step(k)
    est_us = 0.0
    if timed:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(ext)
        with torch.cuda.stream(ext):
            for k in range(n_sets):
                step(k)
        stop.record(ext)
        stop.synchronize()
        est_us = start.elapsed_time(stop) * 1000.0 / n_sets
    torch.cuda.synchronize()
    return est_us


def _replay_times(graph: Any, replays: int) -> list[float]:
    """µs of each of `replays` replays of `graph`, between events on the current stream."""
    import torch

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for start, stop in events:
        start.record()
        graph.replay()
        stop.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(stop) * 1000.0 for start, stop in events]


#: The largest neighbour GEMM a measurement may put between launches (its weights live on the GPU).
MAX_NEIGHBOUR_MB = 4096


def check_neighbour_mb(mb: object) -> int:
    """`mb` as a neighbour size, or ValueError saying the range (0: no neighbour)."""
    if isinstance(mb, bool) or not isinstance(mb, int) or not 0 <= mb <= MAX_NEIGHBOUR_MB:
        raise ValueError(f"neighbour_mb must be an integer 0..{MAX_NEIGHBOUR_MB}, got {mb!r}")
    return mb


def neighbour_gemm(mb: int) -> Callable[[], Any]:
    """A GEMM of 16 rows over `mb` MB of bf16 weights (7168 wide, as a large model's hidden size):
    its cuBLAS code and weights stand in for the layer's other kernels between two attention calls,
    so a timing with it between launches sees the cold instruction and data caches an engine's
    attention sees. More than the L2 makes its own time independent of what ran before it."""
    import torch

    n = max(1, check_neighbour_mb(mb) * 2**20 // (ITEMSIZE["bfloat16"] * 7168))
    x = torch.randn(16, 7168, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(7168, n, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(16, n, dtype=torch.bfloat16, device="cuda")
    return lambda: torch.matmul(x, w, out=y)


def less(t: Timing, us: float) -> Timing:
    """`t` with `us` taken off every sample: a timing with the neighbour, less the neighbour's own."""
    return summarize([s - us for s in t.samples])


T = TypeVar("T")


def interleave(measures: Sequence[Callable[[], T]], rounds: int) -> list[list[T]]:
    """Run every measurement once per round, in turn (A, B, A, B, ...), so drift and clock changes
    hit every candidate alike; per candidate, its results in round order."""
    results: list[list[T]] = [[] for _ in measures]
    for _ in range(rounds):
        for i, measure in enumerate(measures):
            results[i].append(measure())
    return results


def copy_bandwidth(reps: int = 10) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second): the memory ceiling
    that memory floors are computed against."""
    import torch

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(2):
        b.copy_(a)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        b.copy_(a)
    stop.record()
    torch.cuda.synchronize()
    bw = 2 * n * reps / (start.elapsed_time(stop) / 1000)
    del a, b
    torch.cuda.empty_cache()
    return bw
