"""Which device the op launches on, without a GPU: a stand-in for cuda-python's driver module
records every call, so a tensor-parallel rank's op is seen to retain and use its own device's
primary context, read that device's limits and load the cubin built for its arch -- not device
0's. (tests/engine/test_op_gpu.py runs the real op; two devices need the x2 machine.)"""

from __future__ import annotations

import ctypes
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from verify_tuner.engine import op
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.validate import smem_bytes

CFG = KernelConfig(nsplit=94, ht=4, tk=16, block=256, stages=2, wr=4, wk=2, pipe=1)  # fits both devices
BIG = KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3)  # 227 KB: the H200 only
#: Two kinds of device: index 0 an H200, index 3 an RTX PRO 6000 Blackwell (what differs: arch, SMs, smem).
DEVICES = {0: ("NVIDIA H200", 9, 0, 132, 232448), 3: ("NVIDIA RTX PRO 6000 Blackwell", 12, 0, 188, 101376)}


class FakeDriver(types.ModuleType):
    """The subset of cuda.bindings.driver that kernels/runtime.py calls, answering as a driver would."""

    class CUresult:
        CUDA_SUCCESS = 0

    def __init__(self) -> None:
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
        self.globals = {b"kSmemBytes": smem_bytes(CFG, 9), b"kReduceThreads": 256, b"kUsesPdl": 1}  # CFG's layout
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
        return 0, self.addresses[name], 4

    def cuMemcpyDtoH(self, dst, src, size):
        name = next(n for n, a in self.addresses.items() if a == src)
        ctypes.c_int32.from_address(dst).value = self.globals[name]
        return (0,)

    def cuFuncSetAttribute(self, fn, attr, value):
        return (0,)

    def cuFuncGetAttribute(self, attr, fn):
        return 0, {"threads": 1024, "regs": 128}[attr]


@pytest.fixture
def driver(monkeypatch):
    fake = FakeDriver()
    cuda = types.ModuleType("cuda")
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = fake
    cuda.bindings = bindings
    for name, mod in (("cuda", cuda), ("cuda.bindings", bindings), ("cuda.bindings.driver", fake)):
        monkeypatch.setitem(sys.modules, name, mod)
    built: list[tuple] = []
    monkeypatch.setattr(op, "_cubin", lambda cfg, q_len, arch: built.append((cfg, q_len, arch)) or arch.encode())
    monkeypatch.setattr(op, "_kernels", {})
    monkeypatch.setattr(op, "_limits", {})
    fake.built = built
    return fake


def test_a_rank_on_device_3_loads_into_device_3_s_context_for_its_arch(driver):
    kernels = op._kernels_for(3, CFG, 9, 8)
    assert ("cuDeviceGet", 3) in driver.calls and ("cuDeviceGet", 0) not in driver.calls
    assert driver.calls[-1] == ("cuModuleLoadData", "ctx3", b"sm_120")  # the cubin for device 3's arch
    assert driver.built == [(CFG, 9, "sm_120")] and kernels.sm_count == 188 and kernels.smem == smem_bytes(CFG, 9)


def test_each_device_gets_its_own_module_and_a_second_call_reuses_it(driver):
    on3 = op._kernels_for(3, CFG, 9, 8)
    on0 = op._kernels_for(0, CFG, 9, 8)
    assert on3 is not on0 and on3.module == "module@ctx3" and on0.module == "module@ctx0"
    assert op._kernels_for(3, CFG, 9, 8) is on3
    assert [c[2] for c in driver.calls if c[0] == "cuModuleLoadData"] == [b"sm_120", b"sm_90"]


def test_a_config_that_does_not_fit_the_rank_s_device_is_refused_before_loading(driver):
    from verify_tuner.kernels.errors import InvalidConfig

    driver.globals[b"kSmemBytes"] = smem_bytes(BIG, 9)
    op._kernels_for(0, BIG, 9, 8)
    with pytest.raises(InvalidConfig, match="shared memory"):
        op._kernels_for(3, BIG, 9, 8)
    assert [c[2] for c in driver.calls if c[0] == "cuModuleLoadData"] == [b"sm_90"]


def test_the_registered_op_reaches_its_own_checks_through_torch_s_dispatch():
    """Called as engines call it (every argument, workspace None): torch's dispatch must hand the
    call to the op, whose own check then refuses CPU tensors by name -- an op schema torch cannot
    dispatch (a mutated argument left to a default) fails before that with an IndexError."""
    B, Q, H = 2, 9, 8
    bf, i32 = {"dtype": torch.bfloat16}, {"dtype": torch.int32}
    args = (
        torch.zeros(B, Q, H, 576, **bf), None, torch.zeros(100, 576, **bf), torch.zeros(B + 1, **i32),
        torch.zeros(10, **i32), None, torch.zeros(B, Q, **i32), torch.zeros(B, Q, dtype=torch.int64),
        torch.zeros(B, Q, H, 512, **bf), None, op.config_list(CFG), 0.04, None,
    )  # fmt: skip
    with pytest.raises(ValueError, match="runs on a CUDA device"):
        torch.ops.verify_tuner.verify_attention(*args)
    with pytest.raises(ValueError, match="runs on a CUDA device"):
        torch.ops.verify_tuner.verify_attention(*args[:-1], torch.zeros(16, dtype=torch.uint8))
