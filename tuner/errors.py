"""The project's typed errors: the kernel's (verify_tuner.kernels.errors, the lowest layer) plus storage and lookup errors."""

from __future__ import annotations

from verify_tuner.kernels.errors import CompileError, InvalidConfig, LaunchError, TunerError

__all__ = [
    "BadParameter",
    "BadPrefixWeights",
    "BadSetting",
    "CompileError",
    "InvalidConfig",
    "LaunchError",
    "StorageError",
    "StudyStorageError",
    "TunerError",
]


class StorageError(TunerError):
    """The configuration database failed or holds something it should not."""


class StudyStorageError(TunerError):
    """The Optuna study storage cannot be opened; the message names it (not the config database,
    whose failures StorageError reports)."""


class BadSetting(TunerError, ValueError):
    """A TUNER_* setting is malformed; the message names it and what it takes."""


class BadParameter(TunerError):
    """A lookup parameter is wrong (unknown device, no config can exist); names the parameter."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


class BadPrefixWeights(TunerError, ValueError):
    """An operator's prefix-weights file (`--prefix-weights`) cannot be used; one line naming the
    file, and the entry or rule it breaks."""
