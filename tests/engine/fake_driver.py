"""A stand-in for cuda-python's driver module (`cuda.bindings.driver`): the subset
kernels/runtime.py calls, answering as a driver would, recording the device calls and accepting
launches without running them. tests/engine/test_op_device.py checks the op's device handling
with it; bench/host_cost.py --stub times the op's host path with it on a machine without a GPU."""

from __future__ import annotations

import ctypes
import functools
import sys
import types

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.validate import smem_bytes

#: A config that fits both devices below: the stand-in's cubin globals describe its layout.
CFG = KernelConfig(nsplit=94, ht=4, tk=16, block=256, stages=2, wr=4, wk=2, pipe=1)

#: Two kinds of device: index 0 an H200, index 3 an RTX PRO 6000 Blackwell (what differs: arch, SMs, smem).
DEVICES = {0: ("NVIDIA H200", 9, 0, 132, 232448), 3: ("NVIDIA RTX PRO 6000 Blackwell", 12, 0, 188, 101376)}


class FakeDriver(types.ModuleType):
    """The subset of cuda.bindings.driver that kernels/runtime.py calls, answering as a driver would."""

    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_NOT_FOUND = 500

    def __init__(self, cfg: KernelConfig = CFG, q_len: int = 9) -> None:
        super().__init__("cuda.bindings.driver")
        self.calls: list[tuple] = []
        self.current = None
        attrs = ("COMPUTE_CAPABILITY_MAJOR", "COMPUTE_CAPABILITY_MINOR", "MULTIPROCESSOR_COUNT",
                 "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
                 "MAX_REGISTERS_PER_MULTIPROCESSOR", "MAX_REGISTERS_PER_BLOCK", "MAX_THREADS_PER_BLOCK",
                 "L2_CACHE_SIZE")  # fmt: skip
        self.CUdevice_attribute = types.SimpleNamespace(**{f"CU_DEVICE_ATTRIBUTE_{a}": a for a in attrs})
        self.CUfunction_attribute = types.SimpleNamespace(
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="dyn",
            CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK="threads",
            CU_FUNC_ATTRIBUTE_NUM_REGS="regs",
        )
        self.globals = {
            b"kSmemBytes": smem_bytes(cfg, q_len),
            b"kReduceThreads": 256,
            b"kReduceMaxPieces": 16,
            b"kUsesPdl": 1,
        }
        self.addresses = {name: 0x1000 + 16 * i for i, name in enumerate(self.globals)}

    def cuInit(self, flags):
        return (0,)

    def cuDeviceGet(self, index):
        self.calls.append(("cuDeviceGet", index))
        return 0, index

    def cuDevicePrimaryCtxRetain(self, dev):
        return 0, f"ctx{dev}"

    def cuCtxSetCurrent(self, ctx):
        self.current = ctx
        return (0,)

    def cuDeviceGetAttribute(self, attr, dev):
        _, major, minor, sms, optin = DEVICES[dev]
        values = {"COMPUTE_CAPABILITY_MAJOR": major, "COMPUTE_CAPABILITY_MINOR": minor, "MULTIPROCESSOR_COUNT": sms,
                  "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": optin, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": optin + 1024,
                  "MAX_REGISTERS_PER_MULTIPROCESSOR": 65536, "MAX_REGISTERS_PER_BLOCK": 65536,
                  "MAX_THREADS_PER_BLOCK": 1024, "L2_CACHE_SIZE": 50 << 20}  # fmt: skip
        return 0, values[attr]

    def cuDeviceGetName(self, n, dev):
        return 0, DEVICES[dev][0].encode() + b"\0" * 8

    def cuModuleLoadData(self, cubin):
        self.calls.append(("cuModuleLoadData", self.current, cubin))
        return 0, f"module@{self.current}"

    def cuModuleGetFunction(self, module, name):
        return 0, (module, name)

    def cuModuleGetGlobal(self, module, name):
        if name not in self.addresses:  # a cubin that does not declare it
            return self.CUresult.CUDA_ERROR_NOT_FOUND, 0, 0
        return 0, self.addresses[name], 4

    def cuMemcpyDtoH(self, dst, src, size):
        name = next(n for n, a in self.addresses.items() if a == src)
        ctypes.c_int32.from_address(dst).value = self.globals[name]
        return (0,)

    def cuFuncSetAttribute(self, fn, attr, value):
        return (0,)

    def cuFuncGetAttribute(self, attr, fn):
        return 0, {"threads": 1024, "regs": 128}[attr]

    # -- launches: accepted and counted, never run --------------------------------------------
    class CUlaunchConfig:
        numAttrs = 0

    class CUlaunchAttribute:
        def __init__(self) -> None:
            self.value = types.SimpleNamespace()

    CUlaunchAttributeID = types.SimpleNamespace(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION=1)

    @staticmethod
    def CUstream(handle):
        return handle

    launches = 0

    def cuLaunchKernelEx(self, config, fn, args, extra):
        self.launches += 1
        self._last = (fn, args)  # read back only when asked: the host-cost benchmark times this path
        return (0,)

    @property
    def last_args(self) -> tuple:
        """(kernel name, argument values) of the last launch."""
        fn, params = self._last
        return (fn[1], launch_values(fn, params))


def launch_values(fn, params) -> tuple:
    """The argument values a launch passed, as the driver would read them: `params` is the address
    of a void* array (kernels/runtime.PackedArgs) or cuda-python's (values, types) tuple."""
    if isinstance(params, tuple):
        return tuple(params[0])
    from verify_tuner.kernels.abi import PARTIAL_ARGS, REDUCE_ARGS

    codes = PARTIAL_ARGS if fn[1] == b"verify_attn_partial" else REDUCE_ARGS
    kinds = {"P": ctypes.c_void_p, "i": ctypes.c_int, "f": ctypes.c_float}
    slots = (ctypes.c_void_p * len(codes)).from_address(params)
    values = (kinds[c].from_address(slots[i]).value for i, c in enumerate(codes))
    return tuple(0 if v is None else v for v in values)  # a null pointer reads back as None


def install(setitem=None, fake: FakeDriver | None = None) -> FakeDriver:
    """Put a FakeDriver where `from cuda.bindings import driver` finds it and return it: through
    `setitem(sys.modules, name, module)` (a test's monkeypatch.setitem, undone after the test), or
    for good when setitem is None (a benchmark process)."""
    fake = fake or FakeDriver()
    cuda = types.ModuleType("cuda")
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = fake
    cuda.bindings = bindings
    put = setitem or (lambda mapping, key, value: mapping.__setitem__(key, value))
    for name, mod in (("cuda", cuda), ("cuda.bindings", bindings), ("cuda.bindings.driver", fake)):
        put(sys.modules, name, mod)
    return fake


def host_only(setattr, setitem) -> FakeDriver:
    """Run the op's host path on CPU tensors, through torch's dispatch: the stand-in driver (the
    launches are accepted, not run), stream 0 for torch's current stream, the layout checks
    without their "on a CUDA device" rule, a CPU tensor's device read as index 0, and the cubin
    bytes from no compiler. `setattr` / `setitem` are a monkeypatch's (or plain ones that last)."""
    import torch
    from verify_tuner.engine import op
    from verify_tuner.kernels import abi

    fake = install(setitem)
    setattr(op, "call_layout", functools.partial(abi.call_layout, on_cuda=False))
    setattr(op, "_cubin", lambda cfg, q_len, arch, kv_dtype: arch.encode())
    kernels_for = op._kernels_for
    setattr(op, "_kernels_for", lambda device, *rest: kernels_for(0 if device is None else device, *rest))
    setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0))
    for name in ("_kernels", "_plans", "_workspace", "_limits"):
        setattr(op, name, {})
    return fake
