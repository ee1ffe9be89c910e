"""Programmatic dependent launch of the reduce kernel (sm_90 and newer), through the CUDA driver.

With it the reduce grid is scheduled while the partial grid still runs and waits in
`griddepcontrol.wait` for the partial's results, instead of starting only after the partial has
drained: that hides the launch of the second kernel. PyCUDA has no `cuLaunchKernelEx`, so this
module loads the same cubin once more through ctypes (into the context PyCUDA made current) and
launches the reduce with the PROGRAMMATIC_STREAM_SERIALIZATION attribute. The kernel reports
whether it was compiled with the matching device code (`kUsesPdl`); kernels/launch.py uses this
path only then, and the plain PyCUDA launch otherwise (sm_80, or -DVA_NO_PDL).
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_char, c_int, c_uint, c_uint64, c_void_p

from verify_tuner.kernels.errors import LaunchError

CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # cuda.h, CUlaunchAttributeID


class _AttrValue(ctypes.Union):  # CUlaunchAttributeValue: 64 bytes, pointer-aligned
    _fields_ = [("pad", c_char * 64), ("programmatic_stream_serialization", c_int), ("_align", c_void_p)]


class _Attr(ctypes.Structure):  # CUlaunchAttribute
    _fields_ = [("id", c_int), ("pad", c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("gridDimX", c_uint),
        ("gridDimY", c_uint),
        ("gridDimZ", c_uint),
        ("blockDimX", c_uint),
        ("blockDimY", c_uint),
        ("blockDimZ", c_uint),
        ("sharedMemBytes", c_uint),
        ("hStream", c_void_p),
        ("attrs", POINTER(_Attr)),
        ("numAttrs", c_uint),
    ]


_driver: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    return _driver


def _check(rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        _lib().cuGetErrorName(rc, byref(name))
        raise LaunchError(f"{what} failed: {name.value.decode() if name.value else rc}")


#: PyCUDA's argument letters: P a device pointer, i a 32-bit int, f a float.
_ARG_TYPES = {"P": c_uint64, "i": ctypes.c_int32, "f": ctypes.c_float}


class DependentLaunch:
    """One kernel of a cubin, launched as a programmatic dependent of the previous launch on the
    stream. `arg_format` spells its arguments as PyCUDA's prepare() does ("PPi": two pointers
    and an int); the argument block is built once."""

    def __init__(self, cubin: bytes, name: str, arg_format: str) -> None:
        lib = _lib()
        self._module, self._func = c_void_p(), c_void_p()
        _check(lib.cuModuleLoadData(byref(self._module), ctypes.c_char_p(cubin)), "cuModuleLoadData")
        _check(lib.cuModuleGetFunction(byref(self._func), self._module, name.encode()), f"cuModuleGetFunction({name})")
        self._args = [_ARG_TYPES[c]() for c in arg_format]
        self._params = (c_void_p * len(self._args))(*[ctypes.addressof(a) for a in self._args])
        self._attr = _Attr(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        self._attr.value.programmatic_stream_serialization = 1
        self._cfg = _Config(blockDimY=1, blockDimZ=1, sharedMemBytes=0, attrs=ctypes.pointer(self._attr), numAttrs=1)

    def __call__(self, grid: tuple[int, int, int], block: int, stream_handle: int, *args: float) -> None:
        cfg = self._cfg
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX = block
        cfg.hStream = stream_handle or None
        for slot, value in zip(self._args, args, strict=True):
            slot.value = value
        _check(_lib().cuLaunchKernelEx(byref(cfg), self._func, self._params, None), "cuLaunchKernelEx")

    def close(self) -> None:
        module = getattr(self, "_module", None)  # None when __init__ failed before loading
        if module:
            _lib().cuModuleUnload(module)  # teardown: at interpreter exit the context may be gone
            self._module = c_void_p()

    def __del__(self) -> None:
        self.close()
