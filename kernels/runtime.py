"""Launch a compiled config from its cubin with NVIDIA's cuda-python (the engine-side loader).

An inference host needs neither nvcc nor PyCUDA: the cubin comes from a bundle the tuner wrote
(tuner/engine/bundle.py), cuda.bindings (binary wheels) loads it into the primary context of the
tensors' device, the one torch uses, and the launch goes to whatever stream handle the caller
passes (torch's current stream in tuner/engine/op.py). Grids, argument order and the workspace come
from kernels/abi.py, as for the tuner's PyCUDA launcher.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

from verify_tuner.kernels.abi import PARTIAL_ARGS, REDUCE_ARGS, LaunchSpec, Layout, reduce_grid
from verify_tuner.kernels.errors import InvalidConfig, LaunchError
from verify_tuner.kernels.validate import smem_bytes

_SLOT = {"P": "Q", "i": "i4x", "f": "f4x"}  # pointers, int32 and float32, each in an 8-byte slot


class PackedArgs:
    """A kernel's argument block, built once: an 8-byte slot per argument and the void* array of
    the slots' addresses that cuLaunchKernelEx reads. A launch packs the values into the slots with
    one struct call and hands the driver the array's address, so cuda-python converts nothing per
    call (its (values, types) form builds every argument anew each launch); the driver copies the
    values when it enqueues (or captures) the launch, so the next call may overwrite them."""

    def __init__(self, codes: str) -> None:
        self._format = struct.Struct("<" + "".join(_SLOT[c] for c in codes))
        self.block = ctypes.create_string_buffer(8 * len(codes))
        base = ctypes.addressof(self.block)
        self.array = (ctypes.c_void_p * len(codes))(*(base + 8 * i for i in range(len(codes))))
        self.address = ctypes.addressof(self.array)

    def fill(self, args: tuple[int | float, ...]) -> int:
        """Write `args` (in the kernel's order) and return the address to pass as kernelParams."""
        self._format.pack_into(self.block, 0, *args)
        return self.address


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def _ok(result: Any, what: str, drv: Any = None) -> Any:
    """cuda.bindings returns (CUresult, values...): the values, or a LaunchError naming the call.
    `drv`: the driver module when the caller holds it (the launch path: no import a call)."""
    drv = drv or _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        name = drv.cuGetErrorName(err)[1]
        raise LaunchError(f"{what} failed: {name.decode() if isinstance(name, bytes) else err}")
    return values[0] if len(values) == 1 else values


def make_current(device_index: int) -> None:
    """Make the device's primary context (torch's) current on this thread."""
    drv = _driver()
    _ok(drv.cuInit(0), "cuInit")
    dev = _ok(drv.cuDeviceGet(device_index), "cuDeviceGet")
    ctx = _ok(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    _ok(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


class CubinKernels:
    """One config's partial and reduce kernels, loaded from cubin bytes into the current context
    (the engine op's primary context, or the tuner's PyCUDA one: both launch through here)."""

    def __init__(self, cubin: bytes, spec: LaunchSpec, *, sm_count: int) -> None:
        drv = _driver()
        self.spec, self.sm_count = spec, sm_count
        self.module = _ok(drv.cuModuleLoadData(cubin), "cuModuleLoadData")
        self.partial = _ok(drv.cuModuleGetFunction(self.module, b"verify_attn_partial"), "cuModuleGetFunction")
        self.reduce = _ok(drv.cuModuleGetFunction(self.module, b"verify_attn_reduce"), "cuModuleGetFunction")
        self.smem = smem_bytes(spec.cfg, spec.q_len, spec.kv_dtype)
        if self._read_int(b"kSmemBytes") != self.smem:  # a bug, not a bad config: the formulas drifted apart
            raise RuntimeError(f"smem formula {self.smem} B != the cubin's layout")
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _ok(drv.cuFuncSetAttribute(self.partial, attr, self.smem), "cuFuncSetAttribute")
        fa = drv.CUfunction_attribute
        max_threads = _ok(drv.cuFuncGetAttribute(fa.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, self.partial), "attr")
        if max_threads < spec.cfg.block:
            regs = _ok(drv.cuFuncGetAttribute(fa.CU_FUNC_ATTRIBUTE_NUM_REGS, self.partial), "attr")
            raise InvalidConfig(
                f"BLOCK={spec.cfg.block} but the compiled kernel allows {max_threads} threads ({regs} registers/thread)"
            )
        self.reduce_threads = self._read_int(b"kReduceThreads")
        # A cubin of a kernel before the reduce's pieces (v6, which benchmarks time beside this one)
        # declares none and merges quarters of rows only.
        self.reduce_max_pieces = self._read_int(b"kReduceMaxPieces") if self._declares(b"kReduceMaxPieces") else 4
        self.reduce16 = None
        if self.reduce_max_pieces == 16:
            self.reduce16 = _ok(drv.cuModuleGetFunction(self.module, b"verify_attn_reduce16"), "cuModuleGetFunction")
        self.uses_pdl = self._read_int(b"kUsesPdl") == 1
        # An engine launches the same few (stream, batch) shapes every step: build each launch's
        # config once (cuda-python objects cost more host time than the launch call itself).
        self._drv = drv
        self._configs: dict[tuple[int, int, int, int, int, int, bool], Any] = {}
        self._partial_args, self._reduce_args = PackedArgs(PARTIAL_ARGS), PackedArgs(REDUCE_ARGS)
        self._packing = threading.Lock()  # one block per kernel: a fill and its launch go together

    def global_ptr(self, name: bytes) -> tuple[int, int]:
        """(device address, bytes) of a __device__ variable of the module."""
        dptr, size = _ok(_driver().cuModuleGetGlobal(self.module, name), f"cuModuleGetGlobal({name.decode()})")
        return int(dptr), int(size)

    def _declares(self, name: bytes) -> bool:
        """Whether the module has the __device__ variable `name` (any failure but its absence raises)."""
        drv = _driver()
        result = drv.cuModuleGetGlobal(self.module, name)
        if result[0] == drv.CUresult.CUDA_ERROR_NOT_FOUND:
            return False
        _ok(result, f"cuModuleGetGlobal({name.decode()})")
        return True

    def _read_int(self, name: bytes) -> int:
        drv = _driver()
        dptr, size = self.global_ptr(name)
        got = ctypes.c_int32()
        _ok(drv.cuMemcpyDtoH(ctypes.addressof(got), dptr, size), "cuMemcpyDtoH")
        return int(got.value)

    def _config(self, grid: tuple[int, int, int], block: int, smem: int, stream: int, pdl: bool) -> Any:
        key = (*grid, block, smem, stream, pdl)
        cfg = self._configs.get(key)
        if cfg is None:
            cfg = self._configs[key] = self._new_config(grid, block, smem, stream, pdl)
        return cfg

    def _new_config(self, grid: tuple[int, int, int], block: int, smem: int, stream: int, pdl: bool) -> Any:
        drv = self._drv
        cfg = drv.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block, 1, 1
        cfg.sharedMemBytes, cfg.hStream = smem, drv.CUstream(stream)
        if pdl:  # the reduce is scheduled while the partial runs and waits in griddepcontrol.wait
            attr = drv.CUlaunchAttribute()
            attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg.attrs, cfg.numAttrs = [attr], 1
        else:
            cfg.numAttrs = 0
        return cfg

    def launch(
        self,
        *,
        stream: int,
        batch: int,
        pointers: dict[str, int | None],
        part_o: int,
        part_lse: int,
        softmax_scale: float,
        layout: Layout | None = None,
        reduce: bool = True,
        partial: bool = True,
        kv_scale: float = 1.0,
    ) -> None:
        """Enqueue partial + reduce on `stream` (a CUstream handle as an int; 0 the legacy default
        stream). reduce=False enqueues the partial alone, partial=False the reduce alone, over the
        partials a previous launch left in the workspace (benchmarks split the time with them).
        `pointers` may hold kv_scale_ptr, a scaled format's device scale (LaunchSpec.partial_args)."""
        if not (reduce or partial):
            raise ValueError("launch with neither kernel")
        drv = self._drv
        spec = self.spec
        if partial:
            args = spec.partial_args(
                part_o=part_o,
                part_lse=part_lse,
                batch=batch,
                softmax_scale=softmax_scale,
                layout=layout,
                kv_scale=kv_scale,
                **pointers,  # type: ignore[arg-type]  # q_pe may be None (576-wide q rows), every other an int
            )
            cfg = self._config(spec.partial_grid(), spec.cfg.block, self.smem, stream, pdl=False)
            with self._packing:
                params = self._partial_args.fill(args)
                _ok(drv.cuLaunchKernelEx(cfg, self.partial, params, 0), "cuLaunchKernelEx(partial)", drv)
        if not reduce:
            return
        blocks, per_block, pieces = reduce_grid(
            batch=batch,
            q_len=spec.q_len,
            H=spec.H,
            sm_count=self.sm_count,
            threads=self.reduce_threads,
            max_pieces=self.reduce_max_pieces,
        )
        args = spec.reduce_args(
            part_o=part_o,
            part_lse=part_lse,
            prefix_indptr=int(pointers["prefix_indptr"]),  # type: ignore[arg-type]  # an int: partial_args took it
            out=int(pointers["out"]),  # type: ignore[arg-type]
            lse=int(pointers["lse"]),  # type: ignore[arg-type]
            batch=batch,
            per_block=per_block,
        )
        cfg = self._config((blocks, 1, 1), self.reduce_threads, 0, stream, pdl=self.uses_pdl)
        with self._packing:
            params = self._reduce_args.fill(args)
            fn = self.reduce16 if pieces == 16 else self.reduce
            _ok(drv.cuLaunchKernelEx(cfg, fn, params, 0), "cuLaunchKernelEx(reduce)", drv)


def read_limits(device_index: int) -> Any:
    """The device's limits through cuda.bindings (kernels.limits.read_device_limits without PyCUDA)."""
    from verify_tuner.kernels.limits import DeviceLimits

    drv = _driver()
    _ok(drv.cuInit(0), "cuInit")
    dev = _ok(drv.cuDeviceGet(device_index), "cuDeviceGet")
    a = drv.CUdevice_attribute

    def get(name: str) -> int:
        return int(_ok(drv.cuDeviceGetAttribute(getattr(a, f"CU_DEVICE_ATTRIBUTE_{name}"), dev), name))

    raw = _ok(drv.cuDeviceGetName(256, dev), "cuDeviceGetName")
    return DeviceLimits(
        name=raw.split(b"\0", 1)[0].decode(),
        cc_major=get("COMPUTE_CAPABILITY_MAJOR"),
        cc_minor=get("COMPUTE_CAPABILITY_MINOR"),
        sm_count=get("MULTIPROCESSOR_COUNT"),
        max_smem_optin=get("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        smem_per_sm=get("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
        regs_per_sm=get("MAX_REGISTERS_PER_MULTIPROCESSOR"),
        regs_per_block=get("MAX_REGISTERS_PER_BLOCK"),
        max_threads_per_block=get("MAX_THREADS_PER_BLOCK"),
        l2_bytes=get("L2_CACHE_SIZE"),
    )
