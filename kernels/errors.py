"""Typed failures shared by kernels/ and tuner/.

Expected failures of one configuration (it cannot fit, does not compile, crashes, computes the
wrong thing) become a failed trial with the reason stored; anything else is a bug and raises.
"""

from __future__ import annotations


class TunerError(Exception):
    """Root of every error this project raises on purpose."""


class InvalidConfig(TunerError):
    """The configuration cannot run on this device or shape; rejected before compiling."""


class CompileError(TunerError):
    """nvcc rejected the rendered source."""


class LaunchError(TunerError):
    """The kernel failed at launch or while running (fault, timeout, dead worker)."""
