"""Load a compiled configuration with PyCUDA and launch it (GPU path only).

The launch path does no allocation and no host synchronisation: the workspace is allocated
once per (config, max batch), arguments are plain device pointers, and the grid is the same for
every batch (the kernels share the batch's work out at run time, kernels/plan.py), so one CUDA
graph captured per batch size follows every prefix and batch composition it is replayed with. Use `pycuda.autoprimaryctx` (the context torch uses) when mixing with
torch tensors; pass `tensor.data_ptr()` or ints.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from verify_tuner.kernels.abi import PARTIAL_ARGS, REDUCE_ARGS, LaunchSpec, reduce_grid
from verify_tuner.kernels.build import compile_cubin, ptxas_report
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig, LaunchError
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.kernels.pdl import DependentLaunch
from verify_tuner.kernels.validate import D_QK, D_V, smem_bytes, validate


def _read_int(module: Any, name: str) -> int:
    """An `extern "C" __device__ const int` the kernel exports (its layout facts)."""
    import pycuda.driver as cuda

    dev, _ = module.get_global(name)
    got = np.empty(1, np.int32)
    cuda.memcpy_dtoh(got, dev)
    return int(got[0])


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
    ) -> None:
        import pycuda.driver as cuda

        validate(cfg, limits, H=H, q_len=q_len)
        self.cfg, self.H, self.q_len, self.max_batch = cfg, H, q_len, max_batch
        self.sm_count = limits.sm_count
        built = compile_cubin(cfg, q_len, limits.arch, cache_dir, extra_flags)
        self.report = ptxas_report(built.ptxas_log) if built.ptxas_log else {}
        self.module = cuda.module_from_buffer(built.cubin)
        self.partial = self.module.get_function("verify_attn_partial")
        self.reduce = self.module.get_function("verify_attn_reduce")
        self.smem = smem_bytes(cfg, q_len)
        layout = _read_int(self.module, "kSmemBytes")
        if layout != self.smem:  # a bug, not a bad config: the formulas drifted apart
            raise RuntimeError(f"smem formula {self.smem} B != kernel layout {layout} B")
        fa = cuda.function_attribute
        self.partial.set_attribute(fa.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem)
        max_threads = self.partial.get_attribute(fa.MAX_THREADS_PER_BLOCK)
        if max_threads < cfg.block:
            raise InvalidConfig(
                f"BLOCK={cfg.block} but the compiled kernel allows {max_threads} threads "
                f"({self.partial.get_attribute(fa.NUM_REGS)} registers/thread)"
            )
        # partials only for requests several parts share: part p's of request b in slot p + b
        self.spec = LaunchSpec(cfg, H, q_len)
        rows = self.spec.workspace_rows(max_batch)
        self._part_o = cuda.mem_alloc(rows * D_V * 2)  # bf16 o / l per slot
        self._part_lse = cuda.mem_alloc(rows * 4)  # fp32 log2-domain lse per slot
        self.partial.prepare(PARTIAL_ARGS)
        self.reduce.prepare(REDUCE_ARGS)
        self.reduce_threads = _read_int(self.module, "kReduceThreads")
        # sm_90+: the reduce goes out as a programmatic dependent launch (kernels/pdl.py)
        uses_pdl = _read_int(self.module, "kUsesPdl") == 1
        self._reduce_pdl = DependentLaunch(built.cubin, "verify_attn_reduce", REDUCE_ARGS) if uses_pdl else None

    def __call__(
        self,
        *,
        q: Any,
        kv: Any,
        prefix_indices: Any,
        prefix_indptr: Any,
        draft_indices: Any,
        tree_mask: Any,
        out: Any,
        lse: Any = None,
        batch: int,
        softmax_scale: float | None = None,
        stream: Any = None,
        reduce: bool = True,
    ) -> None:
        """Enqueue partial + reduce on `stream` (a pycuda Stream or None for the default).
        reduce=False enqueues the partial kernel alone (benchmarks use it to split the time: a
        request that one part holds whole is complete after it, the others need the reduce)."""
        if not 1 <= batch <= self.max_batch:
            raise LaunchError(f"batch {batch} outside 1..{self.max_batch} this launcher was built for")
        scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D_QK)
        work = {"part_o": int(self._part_o), "part_lse": int(self._part_lse)}
        args = self.spec.partial_args(
            q=_ptr(q),
            kv=_ptr(kv),
            prefix_indices=_ptr(prefix_indices),
            prefix_indptr=_ptr(prefix_indptr),
            draft_indices=_ptr(draft_indices),
            tree_mask=_ptr(tree_mask),
            out=_ptr(out),
            lse=_ptr(lse),
            batch=batch,
            softmax_scale=scale,
            **work,
        )
        block = (self.cfg.block, 1, 1)
        self.partial.prepared_async_call(self.spec.partial_grid(), block, stream, *args, shared_size=self.smem)
        if not reduce:
            return
        blocks, per_block = reduce_grid(
            batch=batch, q_len=self.q_len, H=self.H, sm_count=self.sm_count, threads=self.reduce_threads
        )
        grid = (blocks, 1, 1)
        args = self.spec.reduce_args(
            prefix_indptr=_ptr(prefix_indptr), out=_ptr(out), lse=_ptr(lse), batch=batch, per_block=per_block, **work
        )
        if self._reduce_pdl is not None:
            self._reduce_pdl(grid, self.reduce_threads, stream.handle if stream is not None else 0, *args)
            return
        self.reduce.prepared_async_call(grid, (self.reduce_threads, 1, 1), stream, *args)

    def run(self, inputs: Any, out: Any, *, lse: Any = None, stream: Any = None, reduce: bool = True) -> None:
        """Enqueue on one `verify_tuner.kernels.reference.Inputs` set (tests, tuner and benchmarks)."""
        s = inputs
        self(
            q=s.q,
            kv=s.kv,
            prefix_indices=s.prefix_indices,
            prefix_indptr=s.prefix_indptr,
            draft_indices=s.draft_indices,
            tree_mask=s.tree_mask,
            out=out,
            lse=lse,
            batch=s.batch,
            softmax_scale=s.scale,
            stream=stream,
            reduce=reduce,
        )
