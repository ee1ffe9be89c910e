"""The benchmarks' CPU-side parts, which only run on the lent GPU otherwise: a name the library
dropped (bench_kernel imported a removed template list) must fail here, not in a device call."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.limits import known_device
from verify_tuner.kernels.validate import check

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_kernel


@pytest.mark.parametrize("device", ["h200", "rtx-pro-6000"])
@pytest.mark.parametrize(("H", "Q", "P"), [(8, 9, 1024), (8, 1, 131072), (128, 9, 46000)])
def test_bench_kernel_sweep_holds_the_default_and_only_valid_configs(device, H, Q, P):
    limits = known_device(device)
    base = heuristic_config(limits, H=H, q_len=Q, prefix=P)
    configs = bench_kernel.sweep(limits, H, Q, P, base)
    assert base in configs
    assert len(configs) > 3  # neighbours and other templates, not the default alone
    assert all(check(c, limits, H=H, q_len=Q) is None for c in configs)
