"""The MLA verify-attention kernel family: source, validation, compilation and launch.

Import-light on purpose: nothing here imports PyCUDA or torch until a GPU path is used
(`kernels.launch`, `kernels.reference`, `kernels.limits.read_device_limits`).
"""

from kernels.build import KERNEL_NAME, KERNEL_VERSION, kernel_hash, render
from kernels.config import KernelConfig
from kernels.errors import CompileError, InvalidConfig, LaunchError, TunerError
from kernels.limits import DeviceLimits, known_device
from kernels.validate import check, smem_bytes, validate

__all__ = [
    "KERNEL_NAME", "KERNEL_VERSION", "CompileError", "DeviceLimits", "InvalidConfig",
    "KernelConfig", "LaunchError", "TunerError", "check", "kernel_hash",
    "known_device", "render", "smem_bytes", "validate",
]
