"""time_graph's `between`: the neighbour work runs after every launch, in the warm-up and in the
graph that is timed (a count of its runs says exactly how often), on the timed stream."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_between_runs_after_every_launch_in_the_timed_graph():
    import pycuda.autoprimaryctx  # noqa: F401  (torch's primary context)
    import pycuda.driver as cuda
    import torch
    from verify_tuner.kernels.timing import graph_shape, time_graph

    torch.cuda.init()
    stream = cuda.Stream()
    launched, runs = [], torch.zeros((), dtype=torch.int64, device="cuda")
    n_sets, replays = 3, 4
    t = time_graph(lambda k: launched.append(k), n_sets, stream=stream, replays=replays, between=lambda: runs.add_(1))
    torch.cuda.synchronize()
    launches, _ = graph_shape(0.0, n_sets, replays=replays, min_launches=24, budget_us=None)
    # the warm-up runs it once a set; the graph (launches long) is replayed once untimed, then `replays` times
    assert int(runs) == n_sets + launches * (1 + replays)
    assert launched == list(range(n_sets)) + [k % n_sets for k in range(launches)]  # warm-up, then capture
    assert len(t.samples) == replays and t.median_us > 0
