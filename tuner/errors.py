"""The project's typed errors (defined with the kernel, the lowest layer) plus lookup errors."""

from __future__ import annotations

from kernels.errors import CompileError, InvalidConfig, LaunchError, StorageError, TunerError

__all__ = ["BadParameter", "BadSetting", "CompileError", "InvalidConfig", "LaunchError", "StorageError", "TunerError"]


class BadSetting(TunerError, ValueError):
    """A TUNER_* setting is malformed; the message names it and what it takes."""


class BadParameter(TunerError):
    """A lookup parameter is wrong (unknown device, no config can exist); names the parameter."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message
