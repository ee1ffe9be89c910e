"""The tuner's launcher: compile a configuration with nvcc and launch it in PyCUDA's context (GPU
path only).

The launch itself is kernels/runtime.py's, the one the engine op uses: the cubin is loaded with
cuda-python into the current context (PyCUDA's primary context, the one torch uses, after
`import pycuda.autoprimaryctx`) and both kernels go out through cuLaunchKernelEx, the reduce as a
programmatic dependent launch where the kernel was built for it, so the tuner times exactly what
an engine runs. PyCUDA holds the context, the streams, the events and this launcher's workspace.
The launch path does no allocation and no host synchronisation; the grid is the same for every
batch (the kernels share the batch's work out at run time, kernels/plan.py), so one CUDA graph
captured per batch size follows every prefix and batch composition it is replayed with. Pass
`tensor.data_ptr()` or ints.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from verify_tuner.kernels.abi import LaunchSpec, Layout
from verify_tuner.kernels.build import compile_cubin, ptxas_report
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import LaunchError
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.kernels.runtime import CubinKernels
from verify_tuner.kernels.shapes import Q_BYTES
from verify_tuner.kernels.validate import D_QK, D_V, validate


def _ptr(x: Any) -> int:
    if x is None:
        return 0
    if hasattr(x, "data_ptr"):
        return int(x.data_ptr())
    return int(x)


class VerifyAttention:
    """One compiled configuration for fixed (H, q_len), launchable for batches up to max_batch."""

    def __init__(
        self,
        cfg: KernelConfig,
        *,
        H: int,
        q_len: int,
        limits: DeviceLimits,
        max_batch: int,
        cache_dir: Path,
        extra_flags: tuple[str, ...] = (),
        kv_dtype: str = "bf16",
    ) -> None:
        import pycuda.driver as cuda

        validate(cfg, limits, H=H, q_len=q_len, kv_dtype=kv_dtype)
        self.cfg, self.H, self.q_len, self.max_batch = cfg, H, q_len, max_batch
        built = compile_cubin(cfg, q_len, limits.arch, cache_dir, extra_flags, kv_dtype)
        self.report = ptxas_report(built.ptxas_log) if built.ptxas_log else {}
        self.spec = LaunchSpec(cfg, H, q_len, kv_dtype)
        self.kernels = CubinKernels(built.cubin, self.spec, sm_count=limits.sm_count)
        self.smem = self.kernels.smem
        # partials only for requests several parts share: part p's of request b in slot p + b
        rows = self.spec.workspace_rows(max_batch)
        self._part_o = cuda.mem_alloc(rows * D_V * Q_BYTES)  # bf16 o / l per slot
        self._part_lse = cuda.mem_alloc(rows * 4)  # fp32 log2-domain lse per slot

    def __call__(
        self,
        *,
        q: Any,
        q_pe: Any = None,
        kv: Any,
        prefix_indices: Any,
        prefix_indptr: Any,
        prefix_rows: Any = None,
        draft_indices: Any,
        tree_mask: Any,
        out: Any,
        lse: Any = None,
        batch: int,
        softmax_scale: float | None = None,
        stream: Any = None,
        reduce: bool = True,
        partial: bool = True,
        layout: Layout | None = None,
        kv_scale: float = 1.0,
        kv_scale_ptr: Any = None,
    ) -> None:
        """Enqueue partial + reduce on `stream` (a pycuda Stream or None for the default); q_pe and
        layout as in LaunchSpec.partial_args (None: one 576-wide q, page-size-1 slots, uint64 mask).
        reduce=False enqueues the partial kernel alone (benchmarks use it to split the time: a
        request that one part holds whole is complete after it, the others need the reduce);
        partial=False the reduce alone, over the partials the last full launch left. A scaled
        cache format takes its layer scale as kv_scale, or as a device float at kv_scale_ptr."""
        if not 1 <= batch <= self.max_batch:
            raise LaunchError(f"batch {batch} outside 1..{self.max_batch} this launcher was built for")
        given = {"q": q, "kv": kv, "prefix_indices": prefix_indices, "prefix_rows": prefix_rows,
                 "prefix_indptr": prefix_indptr, "draft_indices": draft_indices, "tree_mask": tree_mask,
                 "out": out, "lse": lse, "kv_scale_ptr": kv_scale_ptr}  # fmt: skip
        pointers: dict[str, int | None] = {name: _ptr(t) for name, t in given.items()}
        pointers["q_pe"] = _ptr(q_pe) if q_pe is not None else None  # None: q's own rows hold the rope dims
        self.kernels.launch(
            stream=stream.handle if stream is not None else 0,
            batch=batch,
            pointers=pointers,
            part_o=int(self._part_o),
            part_lse=int(self._part_lse),
            softmax_scale=softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D_QK),
            layout=layout,
            reduce=reduce,
            partial=partial,
            kv_scale=kv_scale,
        )

    def run(
        self, inputs: Any, out: Any, *, lse: Any = None, stream: Any = None, reduce: bool = True, partial: bool = True
    ) -> None:
        """Enqueue on one `verify_tuner.kernels.reference.Inputs` set (tests, tuner and benchmarks)."""
        s = inputs
        self(
            q=s.q,
            q_pe=s.q_pe,
            layout=s.layout(),
            kv=s.kv,
            prefix_indices=s.prefix_indices,
            prefix_indptr=s.prefix_indptr,
            prefix_rows=s.prefix_rows,
            draft_indices=s.draft_indices,
            tree_mask=s.tree_mask,
            out=out,
            lse=lse,
            batch=s.batch,
            softmax_scale=s.scale,
            stream=stream,
            reduce=reduce,
            partial=partial,
            kv_scale=s.kv_scale,
        )
