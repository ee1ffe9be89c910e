"""Several compiled configs in one captured CUDA graph, the step's prefix tokens choosing which runs
(an experiment, bench/graph_switch_probe.py; measured too slow for the product, see its results).

A graph captured once per batch size replays every prefix its requests reach, and one compiled
config cannot be the fastest at all of them (a short prefix wants small blocks, a long one the
72-row seesaw). Inside a capture, `GraphSwitch.enqueue` adds a tiny kernel (csrc/graph_switch.cu)
that reads the batch's prefix tokens from `kv_indptr` and sets a conditional handle, then a SWITCH
node whose branch i holds config i's kernels, captured through a side stream into the node's body
graphs. Each replay runs one branch, but the setter and the node cost 8-11 us a layer on the H200
(driver 580; bench/results/graph_switch_probe_sm_90.md), more than the short configs save, so the
product does not use it. Needs a CUDA 12.8+ driver (SWITCH nodes); outside a capture there is no
node to add, and the caller picks a config itself. One handle drives one node: a second node on
the same handle is refused (CUDA_ERROR_INVALID_VALUE), so layers cannot share a setter.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from verify_tuner.kernels.errors import CompileError, LaunchError
from verify_tuner.kernels.runtime import _driver, _ok

SOURCE = Path(__file__).parent / "csrc" / "graph_switch.cu"
#: Branches a switch may hold (the setter's bounds arguments: one fewer than this).
MAX_BRANCHES = 4
_SETTER_TYPES = (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int)


def compile_switch_cubin(arch: str, cache_dir: Path) -> bytes:
    """The setter's cubin for `arch`, compiled once into `cache_dir` (keyed by source and nvcc)."""
    from verify_tuner.kernels.build import _atomic_write, _build_lock, nvcc_path, nvcc_version

    source = SOURCE.read_text()
    key = hashlib.sha256(f"{source}\0{arch}\0{nvcc_version()}".encode()).hexdigest()[:20]
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"graph_switch_{arch}_{key}.cubin"
    if target.exists():
        return target.read_bytes()
    with _build_lock(cache_dir / f"{target.stem}.lock"):
        if not target.exists():
            with tempfile.TemporaryDirectory(prefix="va-switch-") as tmp:
                out = Path(tmp) / "out.cubin"
                cmd = [nvcc_path(), "-cubin", f"-arch={arch}", "-O3", "-o", str(out), str(SOURCE)]
                proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise CompileError(f"nvcc failed for the graph switch on {arch}:\n{proc.stderr.strip()[-4000:]}")
                _atomic_write(target, out.read_bytes())
    return target.read_bytes()


def check_bounds(bounds: Sequence[int], branches: int) -> tuple[int, ...]:
    """The switch's prefix-token bounds: one fewer than the branches, positive and ascending."""
    b = tuple(int(x) for x in bounds)
    if not 2 <= branches <= MAX_BRANCHES or len(b) != branches - 1:
        raise ValueError(f"a switch holds 2..{MAX_BRANCHES} branches with one bound between each two, got {b}")
    if any(x < 1 for x in b) or any(x >= y for x, y in itertools.pairwise(b)):
        raise ValueError(f"switch bounds must be positive and ascending, got {b}")
    return b


def branch_of(tokens: int, bounds: Sequence[int]) -> int:
    """The branch a step of `tokens` prefix tokens runs (the setter's rule, for hosts and tests)."""
    return sum(tokens >= b for b in bounds)


class GraphSwitch:
    """The setter loaded into the current context, and the side stream bodies are captured on."""

    def __init__(self, cubin: bytes) -> None:
        drv = _driver()
        self.module = _ok(drv.cuModuleLoadData(cubin), "cuModuleLoadData(graph switch)")
        self.setter = _ok(drv.cuModuleGetFunction(self.module, b"verify_attn_switch"), "cuModuleGetFunction")
        self.ctx = _ok(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        flags = drv.CUstream_flags.CU_STREAM_NON_BLOCKING
        self.side = _ok(drv.cuStreamCreate(flags), "cuStreamCreate")

    @staticmethod
    def capturing(stream: int) -> bool:
        drv = _driver()
        status = _ok(drv.cuStreamGetCaptureInfo(drv.CUstream(stream)), "cuStreamGetCaptureInfo")[0]
        return status == drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE

    def enqueue(
        self, *, stream: int, indptr: int, batch: int, bounds: Sequence[int], branches: Sequence[Callable[[int], None]]
    ) -> None:
        """The setter and one SWITCH node after what `stream` captured so far (one per layer); branch
        i's kernels are what `branches[i](side_stream)` enqueues."""
        handle = self._set(stream=stream, indptr=indptr, batch=batch, bounds=bounds, branches=len(branches))
        self._node(stream=stream, handle=handle, branches=branches)

    def _set(self, *, stream: int, indptr: int, batch: int, bounds: Sequence[int], branches: int) -> Any:
        drv = _driver()
        b = check_bounds(bounds, branches)
        graph = self._capture(stream)[1]
        handle = _ok(drv.cuGraphConditionalHandleCreate(graph, self.ctx, 0, 0), "cuGraphConditionalHandleCreate")
        cfg = drv.CUlaunchConfig()
        cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1
        cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1
        cfg.sharedMemBytes, cfg.hStream, cfg.numAttrs = 0, drv.CUstream(stream), 0
        pad = b + (0,) * (MAX_BRANCHES - 1 - len(b))
        args = (int(handle), indptr, batch, len(b), *pad)
        _ok(drv.cuLaunchKernelEx(cfg, self.setter, (args, _SETTER_TYPES), 0), "cuLaunchKernelEx(graph switch)")
        return handle

    def _node(self, *, stream: int, handle: Any, branches: Sequence[Callable[[int], None]]) -> None:
        drv = _driver()
        _, graph, deps, edges, n = self._capture(stream)
        params = drv.CUgraphNodeParams()
        params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = handle
        params.conditional.type = drv.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_SWITCH
        params.conditional.size = len(branches)
        params.conditional.ctx = self.ctx
        node = _ok(drv.cuGraphAddNode(graph, deps, edges, n, params), "cuGraphAddNode(switch)")
        bodies = params.conditional.phGraph_out
        flag = drv.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES
        _ok(drv.cuStreamUpdateCaptureDependencies(drv.CUstream(stream), [node], None, 1, flag), "capture deps")
        relaxed = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        for body, enqueue in zip(bodies, branches):
            _ok(drv.cuStreamBeginCaptureToGraph(self.side, body, None, None, 0, relaxed), "cuStreamBeginCaptureToGraph")
            try:
                enqueue(int(self.side))
            finally:
                _ok(drv.cuStreamEndCapture(self.side), "cuStreamEndCapture(switch body)")

    def _capture(self, stream: int) -> tuple[Any, Any, list[Any], Any, int]:
        drv = _driver()
        status, _id, graph, deps, edges, n = _ok(drv.cuStreamGetCaptureInfo(drv.CUstream(stream)), "capture info")
        if status != drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            raise LaunchError("a graph switch is added only while the stream is being captured")
        return status, graph, list(deps or [])[:n], (list(edges)[:n] if edges else None), n
