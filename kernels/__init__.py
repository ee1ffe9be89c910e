"""The MLA verify-attention kernel family: source, validation, compilation and launch.

Import-light on purpose: nothing here imports PyCUDA or torch until a GPU path is used
(`verify_tuner.kernels.launch`, `verify_tuner.kernels.reference`, `verify_tuner.kernels.limits.read_device_limits`).
The engine-side op and cubin bundle that launch it live in verify_tuner.engine. May import:
`verify_tuner.files` (the compile cache's atomic writes) and nothing else of the project: every
other stage builds on this one.
"""

from verify_tuner.kernels.build import KERNEL_NAME, KERNEL_VERSION, kernel_hash, render
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import CompileError, InvalidConfig, LaunchError, TunerError
from verify_tuner.kernels.limits import DeviceLimits, known_device
from verify_tuner.kernels.validate import check, smem_bytes, validate

__all__ = [
    "KERNEL_NAME",
    "KERNEL_VERSION",
    "CompileError",
    "DeviceLimits",
    "InvalidConfig",
    "KernelConfig",
    "LaunchError",
    "TunerError",
    "check",
    "kernel_hash",
    "known_device",
    "render",
    "smem_bytes",
    "validate",
]
