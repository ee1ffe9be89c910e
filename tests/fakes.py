"""Test doubles (tests only): a fake timing backend and fake in-process measurers."""

from __future__ import annotations

import os
import random
import signal
import time

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.kernels.validate import check
from verify_tuner.measure.backend import CRASHED, OK, WRONG, Measurement, Workload

H200 = known_device("h200")


def fake_cost(cfg: KernelConfig, wl: Workload) -> float:
    """A smooth synthetic landscape with one optimum near NSPLIT=64, HT=8, TK=64, BLOCK=256."""
    import math

    c = 20.0
    c += 6 * abs(math.log2(cfg.nsplit / 64))
    c += 3 * abs(math.log2(cfg.ht / min(8, wl.H)))
    c += 2 * abs(math.log2(cfg.tk / 64)) + 2 * abs(math.log2(cfg.block / 256)) + (cfg.stages - 2)
    return c * (1 + wl.prefix / 100_000)


class FakeBackend:
    """Deterministic timings from fake_cost plus seeded noise; some configs compute the wrong
    result (NSPLIT=12) or crash (NSPLIT=24), as a real kernel might."""

    def __init__(
        self,
        limits=H200,
        noise: float = 0.01,
        seed: int = 0,
        wrong_nsplit: int = 12,
        crash_nsplit: int = 24,
        cost=fake_cost,
    ) -> None:
        self.limits = limits
        self.noise, self.rng = noise, random.Random(seed)
        self.wrong_nsplit, self.crash_nsplit, self.cost = wrong_nsplit, crash_nsplit, cost
        self.measured: list[KernelConfig] = []
        self.remeasured: list[list[KernelConfig]] = []
        self.compiled: list[KernelConfig] = []
        self.workloads: list[Workload] = []  # every workload measured or re-measured, in order

    def _samples(self, cfg: KernelConfig, wl: Workload, n: int) -> list[float]:
        base = self.cost(cfg, wl)
        return [base * (1 + self.rng.gauss(0, self.noise)) for _ in range(n)]

    def measure(self, cfg: KernelConfig, wl: Workload) -> Measurement:
        reason = check(cfg, self.limits, H=wl.H, q_len=wl.q_len, kv_dtype=wl.kv_dtype)
        assert reason is None, f"an invalid config reached the backend: {cfg}: {reason}"
        self.measured.append(cfg)
        self.workloads.append(wl)
        if cfg.nsplit == self.wrong_nsplit:
            return Measurement(WRONG, rel_error=0.5, reason="relative error 0.5 > 0.01")
        if cfg.nsplit == self.crash_nsplit:
            return Measurement(CRASHED, reason="kernel fault: illegal address (fake)")
        s = sorted(self._samples(cfg, wl, 31))
        return Measurement(OK, s[15], s[3], s[27], s, rel_error=0.003)

    def remeasure(self, cfgs: list[KernelConfig], wl: Workload, rounds: int) -> list[Measurement]:
        self.remeasured.append(list(cfgs))
        self.workloads.append(wl)
        out = []
        for cfg in cfgs:
            s = sorted(self._samples(cfg, wl, 10 * rounds))
            n = len(s)
            out.append(Measurement(OK, s[n // 2], s[n // 10], s[9 * n // 10], s))
        return out

    def compile_ahead(self, cfg: KernelConfig, workload: Workload) -> None:
        self.compiled.append(cfg)

    def close(self) -> None:
        pass


class MisbehavingMeasurer:
    """Runs inside verify_tuner.measure.gpu_backend's child process. NSPLIT picks the behaviour: 2 kills the process
    with SIGSEGV, 4 hangs, 12 raises a plain exception (a bug of ours), anything else answers."""

    def __init__(self) -> None:
        self.limits = H200
        self.inner = FakeBackend(wrong_nsplit=-1, crash_nsplit=-1)

    def measure(self, cfg: KernelConfig, wl: Workload) -> Measurement:
        if cfg.nsplit == 2:
            os.kill(os.getpid(), signal.SIGSEGV)
        if cfg.nsplit == 4:
            time.sleep(3600)
        if cfg.nsplit == 12:
            raise ValueError("a deliberate bug in the measuring code")
        return self.inner.measure(cfg, wl)

    def remeasure(self, cfgs, wl, rounds):  # type: ignore[no-untyped-def]
        if any(c.nsplit == 2 for c in cfgs):  # a candidate that faults while the pool is re-timed
            os.kill(os.getpid(), signal.SIGSEGV)
        return self.inner.remeasure(cfgs, wl, rounds)

    def pid(self) -> int:
        return os.getpid()


class SlowFakeBackend(FakeBackend):
    """FakeBackend whose measurements take `seconds` and leave a marker file while they run (so a
    test can kill its process mid-measurement)."""

    def __init__(self, marker: str, seconds: float = 0.5, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.marker, self.seconds = marker, seconds

    def measure(self, cfg: KernelConfig, wl: Workload) -> Measurement:
        from pathlib import Path

        Path(self.marker).write_text(str(cfg))
        time.sleep(self.seconds)
        return super().measure(cfg, wl)


class PacedMeasurer(MisbehavingMeasurer):
    """A measurement that takes a little while, as a real one does, so processes interleave."""

    def measure(self, cfg: KernelConfig, wl: Workload) -> Measurement:
        time.sleep(0.08)
        return super().measure(cfg, wl)


class SlowStartMeasurer(MisbehavingMeasurer):
    """A measurer whose start takes a while after its limits are known (a real one starts torch
    and a CUDA context): it offers probe_limits, and when it is ready it writes `marker` and adds
    a measured copy bandwidth to its limits. `fail=True` raises at the end of its start."""

    def __init__(self, marker: str, seconds: float = 2.0, fail: bool = False) -> None:
        from dataclasses import replace
        from pathlib import Path

        super().__init__()
        time.sleep(seconds)
        if fail:
            raise RuntimeError("no CUDA context (fake)")
        self.limits = replace(H200, copy_bw_gbps=4000.0)
        Path(marker).write_text("ready")

    @staticmethod
    def probe_limits():  # type: ignore[no-untyped-def]
        return H200


class MarkedMeasurer(MisbehavingMeasurer):
    """Each measurement takes half a second and first writes the file named by
    $TEST_MEASURE_MARKER, so a test can signal a real `tuner study start` mid-measurement."""

    def measure(self, cfg: KernelConfig, wl: Workload) -> Measurement:
        from pathlib import Path

        Path(os.environ["TEST_MEASURE_MARKER"]).write_text(str(cfg))
        time.sleep(0.5)
        return self.inner.measure(cfg, wl)  # none of MisbehavingMeasurer's faults: only its start
