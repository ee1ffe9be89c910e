"""The real measurer: runs inside the worker process on the local GPU (PyCUDA + torch)."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import CompileError, InvalidConfig, LaunchError
from verify_tuner.kernels.formats import DEFAULT as DEFAULT_KV_DTYPE
from verify_tuner.kernels.shapes import D_V
from verify_tuner.measure.backend import COMPILE_ERROR, INVALID, OK, WRONG, Measurement, Workload

REL_TOL = 1e-2
#: Device time one measurement may spend replaying (kernels.timing.graph_shape): enough for 30
#: samples of any config near the best, without minutes on configs 100x slower.
BUDGET_US = 100_000.0
MAX_LOADED = 16  # >= the winner phase's pool (top 3 + default + incumbent)


class GpuMeasurer:
    def __init__(self, *, cache_dir: str, reps: int = 30, extra_flags: tuple[str, ...] = ()) -> None:
        import pycuda.autoprimaryctx  # noqa: F401  (torch's primary context)
        import pycuda.driver as cuda
        import torch
        from verify_tuner.kernels.limits import read_device_limits
        from verify_tuner.kernels.timing import copy_bandwidth

        torch.cuda.init()
        self.torch = torch
        self.cache_dir = Path(cache_dir)
        self.reps, self.extra_flags = reps, tuple(extra_flags)
        self.stream = cuda.Stream()  # launches go here; timings replay them as one CUDA graph
        limits = read_device_limits(0)
        from dataclasses import replace

        self.limits = replace(limits, copy_bw_gbps=copy_bandwidth() / 1e9)
        self._workloads: dict[Workload, tuple[list[Any], Any, Any]] = {}
        # Loaded modules + workspaces, least recently used evicted: a long study or a sweep of a
        # thousand configs must not keep every module and workspace alive on the GPU.
        self._launchers: OrderedDict[tuple[KernelConfig, int, int, str, int], Any] = OrderedDict()
        self._neighbours: dict[int, Any] = {}  # by size: the GEMM of workloads timed cold

    @staticmethod
    def probe_limits() -> Any:
        """The device's limits, before torch and the CUDA context start (verify_tuner.measure.gpu_backend sends
        them to the parent first)."""
        from verify_tuner.kernels.limits import read_device_limits

        return read_device_limits(0)

    @staticmethod
    def build(
        cfg: KernelConfig,
        q_len: int,
        arch: str,
        *,
        cache_dir: str,
        kv_dtype: str = DEFAULT_KV_DTYPE,
        extra_flags: tuple[str, ...] = (),
        **_: Any,
    ) -> None:
        """Compile `cfg` into the cache the measurement loads from (no GPU needed: any process,
        any thread). A compile error is the measurement's to report: it compiles again and
        fails the trial with nvcc's message."""
        from verify_tuner.kernels.build import compile_cubin

        try:
            compile_cubin(cfg, q_len, arch, Path(cache_dir), tuple(extra_flags), kv_dtype)
        except CompileError:
            pass

    def _prepare(self, wl: Workload) -> tuple[list[Any], Any, Any]:
        if wl not in self._workloads:
            from verify_tuner.kernels.reference import reference
            from verify_tuner.kernels.timing import rotating_inputs

            self._workloads.clear()  # one workload's inputs at a time: they are sized past the L2
            self._launchers.clear()
            self.torch.cuda.empty_cache()
            sets = rotating_inputs(
                prefix_lens=wl.prefix_lens(),
                q_len=wl.q_len,
                H=wl.H,
                l2_bytes=self.limits.l2_bytes,
                seed=wl.H * 1000 + wl.q_len,
                kv_dtype=wl.kv_dtype,
            )
            ref = reference(sets[0])[0]  # the gate covers every request of the batch
            out = self.torch.empty(wl.batch, wl.q_len, wl.H, D_V, dtype=self.torch.bfloat16, device="cuda")
            self._workloads[wl] = (sets, ref, out)
        return self._workloads[wl]

    def _launcher(self, cfg: KernelConfig, wl: Workload) -> Any:
        from verify_tuner.kernels.launch import VerifyAttention

        key = (cfg, wl.H, wl.q_len, wl.kv_dtype, wl.batch)
        if key in self._launchers:
            self._launchers.move_to_end(key)
        else:
            while len(self._launchers) >= MAX_LOADED:
                self._launchers.popitem(last=False)
            self._launchers[key] = VerifyAttention(
                cfg,
                H=wl.H,
                q_len=wl.q_len,
                limits=self.limits,
                max_batch=wl.batch,
                cache_dir=self.cache_dir,
                extra_flags=self.extra_flags,
                kv_dtype=wl.kv_dtype,
            )
        return self._launchers[key]

    def _neighbour(self, wl: Workload) -> Any:
        """The GEMM put after every launch of `wl` (None: back to back)."""
        if not wl.neighbour_mb:
            return None
        if wl.neighbour_mb not in self._neighbours:
            from verify_tuner.kernels.timing import neighbour_gemm

            self._neighbours[wl.neighbour_mb] = neighbour_gemm(wl.neighbour_mb)
        return self._neighbours[wl.neighbour_mb]

    def _time(self, launch: Any, n_sets: int, wl: Workload, replays: int) -> Any:
        """`launch` timed as `wl` says; with a neighbour, less the neighbour's own time measured
        right after (a graph of the neighbour alone), so drift between the two is seconds."""
        from verify_tuner.kernels.timing import less, time_graph

        between = self._neighbour(wl)
        t = time_graph(launch, n_sets, stream=self.stream, replays=replays, budget_us=BUDGET_US, between=between)
        if between is None:
            return t
        alone = time_graph(lambda k: None, n_sets, stream=self.stream, replays=replays, between=between)
        return less(t, alone.median_us)

    def _launch_fn(self, va: Any, sets: list[Any], out: Any) -> Callable[[int], None]:
        def launch(k: int) -> None:
            va.run(sets[k], out, stream=self.stream)

        return launch

    def _samples(self, launch: Callable[[int], None], n_sets: int, wl: Workload, replays: int) -> list[float]:
        return self._time(launch, n_sets, wl, replays).samples

    def _sync(self) -> None:
        with self._kernel_failures():
            self.torch.cuda.synchronize()

    @contextlib.contextmanager
    def _kernel_failures(self) -> Iterator[None]:
        """CUDA-side failures (the driver through PyCUDA, the runtime through torch: illegal
        address, launch failure, a module that does not load) are the config's, not ours: they
        become LaunchError, which fails the trial and restarts the worker. Anything else raises
        as the bug it is (verify_tuner.measure.gpu_backend stops the study with it)."""
        import pycuda.driver as cuda

        try:
            yield
        except cuda.Error as exc:
            raise LaunchError(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
        except RuntimeError as exc:
            if "CUDA" not in str(exc):
                raise
            raise LaunchError(str(exc).splitlines()[0]) from exc

    def measure(self, cfg: KernelConfig, wl: Workload) -> Measurement:
        from verify_tuner.kernels.reference import poisoned_run_error

        sets, ref, out = self._prepare(wl)
        try:
            with self._kernel_failures():
                va = self._launcher(cfg, wl)
        except InvalidConfig as exc:
            return Measurement(INVALID, reason=str(exc))
        except CompileError as exc:
            return Measurement(COMPILE_ERROR, reason=str(exc)[-2000:])
        launch = self._launch_fn(va, sets, out)
        with self._kernel_failures():
            err = poisoned_run_error(lambda: launch(0), out, ref)
        if not err <= REL_TOL:
            return Measurement(WRONG, rel_error=err, reason=f"relative error {err:.3g} > {REL_TOL}")
        with self._kernel_failures():
            t = self._time(launch, len(sets), wl, self.reps)
            self._sync()
        return Measurement(OK, t.median_us, t.p10_us, t.p90_us, t.samples, rel_error=err)

    def remeasure(self, cfgs: list[KernelConfig], wl: Workload, rounds: int) -> list[Measurement]:
        from verify_tuner.kernels.timing import interleave, summarize

        sets, _, out = self._prepare(wl)
        per_round = max(10, self.reps // 2)
        with self._kernel_failures():
            launches = [self._launch_fn(self._launcher(c, wl), sets, out) for c in cfgs]
            rounds_ = interleave([partial(self._samples, f, len(sets), wl, per_round) for f in launches], rounds)
            self._sync()
        result = []
        for per in rounds_:
            s = [x for samples in per for x in samples]
            t = summarize(s)
            result.append(Measurement(OK, t.median_us, t.p10_us, t.p90_us, s))
        return result
