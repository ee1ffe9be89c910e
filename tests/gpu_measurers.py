"""Test-only measurers around the real GPU one: chosen configs compile the kernel's fault or
hang variant (VA_TEST_FAULT / VA_TEST_HANG), everything else runs the real kernel."""

from __future__ import annotations

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.measure.gpu import GpuMeasurer

FAULT = KernelConfig(nsplit=2, ht=8, tk=32, block=256)
HANG = KernelConfig(nsplit=4, ht=8, tk=32, block=256)


class FaultInjectingGpuMeasurer(GpuMeasurer):
    def measure(self, cfg, wl):  # type: ignore[no-untyped-def]
        self.extra_flags = {FAULT: ("-DVA_TEST_FAULT",), HANG: ("-DVA_TEST_HANG",)}.get(cfg, ())
        return super().measure(cfg, wl)
