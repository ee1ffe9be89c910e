"""Crash isolation: measurements run in a child process that owns the CUDA context.

A config that faults (illegal address), hangs (no answer within the timeout) or kills the
process fails only its own trial, with the reason; the child is restarted and the study goes on.
Anything else the measurer raises is a bug in this project, not a kernel failure: the child
sends its traceback, and the parent raises MeasurerBug with it, which stops the study.
The measuring object inside the child is named by "module:Class" (the product uses
verify_tuner.measure.gpu:GpuMeasurer; tests name their own doubles).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import re
import signal
import threading
import traceback
from typing import Any

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import LaunchError
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.measure.backend import CRASHED, TIMEOUT, Measurement, Workload

DEFAULT_MEASURER = "verify_tuner.measure.gpu:GpuMeasurer"


class MeasurerBug(RuntimeError):
    """The measuring process raised something that is not a kernel failure; carries its traceback."""


START_TIMEOUT_S = 180.0


def start_hint(error: str, ordinal: int | None) -> str:
    """What to check when the measuring child could not start with `error` on GPU `ordinal`."""
    missing = re.match(r"ModuleNotFoundError: No module named '([\w.]+)'", error)
    if missing and missing.group(1).split(".")[0] in ("pycuda", "torch"):
        return "measuring needs the CUDA extra: pip install -e '.[cuda]' (with the CUDA toolkit) on a GPU host"
    gpu = "the GPU" if ordinal is None else f"GPU {ordinal}"
    return f"check that `nvidia-smi` lists {gpu} and that this user may open /dev/nvidia*"


def _load(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _child_main(conn: Any, target: str, kwargs: dict[str, Any], device_ordinal: int | None) -> None:
    # Ctrl-C reaches the whole process group: the parent handles it and closes the pipe, which ends
    # this loop; a KeyboardInterrupt here only printed a second traceback under the parent's line.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _serve(conn, target, kwargs, device_ordinal)
    except (BrokenPipeError, ConnectionResetError):  # the parent is gone (killed): nobody to answer
        os._exit(0)


def _serve(conn: Any, target: str, kwargs: dict[str, Any], device_ordinal: int | None) -> None:
    if device_ordinal is not None:  # before anything touches CUDA: the child sees one GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device_ordinal)
    try:
        cls = _load(target)
        probe = getattr(cls, "probe_limits", None)
        if probe is not None:  # the parent plans and compiles with these while the measurer starts
            conn.send(("limits", probe()))
        measurer = cls(**kwargs)
    except Exception as exc:  # noqa: BLE001 -- any start failure is reported to the parent, which raises it
        conn.send(("init_error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", measurer.limits))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "close":
            return
        method, args = msg
        try:
            conn.send(("ok", getattr(measurer, method)(*args)))
        except LaunchError as exc:  # the CUDA context is poisoned: report and die
            conn.send(("crashed", str(exc)))
            os._exit(3)
        except Exception:  # noqa: BLE001 -- a bug, not the kernel: the parent stops the study with its traceback
            conn.send(("bug", traceback.format_exc()))
            os._exit(4)


class IsolatedBackend:
    """Backend whose measurements run in a restartable child process.

    The constructor starts the child and returns: the caller's own start (its imports, the
    database) overlaps the child's. `limits` waits for the device's limits, and a child that
    cannot start raises there. A measurer class may offer `probe_limits()` (the device's limits,
    read before the slow part of its start: torch, the CUDA context, the bandwidth probe) and
    `build(cfg, q_len, arch, kv_dtype=..., **measurer_kwargs)` (compile without a GPU). With the first, `limits`
    is known early and the first measurement waits for the rest of the start (most of it importing
    torch), so the caller's setup and first compiles overlap it; `limits` then gains what the
    measurer measured at start (the copy bandwidth). With the second, `compile_ahead` builds in the
    calling thread. Calls into the child are serialised: any thread may call."""

    def __init__(
        self,
        *,
        measurer: str = DEFAULT_MEASURER,
        measurer_kwargs: dict[str, Any] | None = None,
        device_ordinal: int | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        self._target, self._kwargs = measurer, dict(measurer_kwargs or {})
        self._ordinal, self.timeout_s = device_ordinal, timeout_s
        self._ctx = mp.get_context("spawn")  # never fork a process that may hold a CUDA context
        self._proc: Any = None
        self._conn: Any = None
        self._ready = False
        self._lock = threading.Lock()
        try:
            self._build = getattr(_load(measurer), "build", None)
        except (ImportError, AttributeError):  # the child's start reports it, with the same name
            self._build = None
        self.restarts = 0
        self._limits: DeviceLimits | None = None
        self._start()

    @property
    def limits(self) -> DeviceLimits:
        """The device's limits (waits for the child's first word; LaunchError if it cannot start)."""
        if self._limits is None:
            with self._lock:
                while self._limits is None:
                    self._read_start()
        return self._limits

    def _recv_start(self, what: str) -> tuple[str, Any]:
        if not self._conn.poll(START_TIMEOUT_S):
            self._kill()
            raise LaunchError(f"measurement worker did not {what} within {START_TIMEOUT_S:.0f} s")
        try:
            status, payload = self._conn.recv()
        except EOFError:
            raise LaunchError(f"measurement worker died while starting (exit {self._proc.exitcode})") from None
        if status not in ("limits", "ready"):
            raise LaunchError(f"measurement worker failed to start: {payload}; {start_hint(payload, self._ordinal)}")
        return status, payload

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(
            target=_child_main,
            args=(child, self._target, self._kwargs, self._ordinal),
            daemon=True,
            name="tuner-measure",
        )
        self._proc.start()
        child.close()
        self._conn = parent
        self._ready = self._probed = False

    def _read_start(self) -> None:
        """Read the child's next word of its start (with `_lock` held): its probed limits, or
        that it is ready (with the limits it measured, which replace them)."""
        status, payload = self._recv_start("finish starting" if self._probed else "start")
        self._probed = True
        self._ready = status == "ready"
        if self._ready or self._limits is None:  # a restart's probe leaves the measured limits
            self._limits = payload

    def _await_ready(self) -> None:
        while not self._ready:
            self._read_start()

    def _kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
        if self._proc is not None:
            self._proc.join(10)
        if self._conn is not None:
            self._conn.close()

    def _restart(self) -> None:
        self._kill()
        self.restarts += 1
        self._start()
        self._await_ready()

    def _call(self, method: str, args: tuple[Any, ...], timeout: float) -> Any:
        with self._lock:
            self._await_ready()
            return self._call_ready(method, args, timeout)

    def _call_ready(self, method: str, args: tuple[Any, ...], timeout: float) -> Any:
        if not self._proc.is_alive():
            self._restart()
        self._conn.send((method, args))
        if not self._conn.poll(timeout):
            self._restart()
            return Measurement(TIMEOUT, reason=f"no result within {timeout:.0f} s: worker killed and restarted")
        try:
            status, payload = self._conn.recv()
        except EOFError:
            self._proc.join(10)
            code = self._proc.exitcode
            how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            self._restart()
            return Measurement(CRASHED, reason=f"worker process died ({how}): restarted")
        if status == "crashed":
            self._restart()
            return Measurement(CRASHED, reason=f"kernel fault: {payload}")
        if status == "bug":
            self._kill()
            raise MeasurerBug(f"the measuring process raised (a bug, not a kernel failure):\n{payload}")
        return payload

    def measure(self, cfg: KernelConfig, workload: Workload) -> Measurement:
        return self._call("measure", (cfg, workload), self.timeout_s)

    def remeasure(self, cfgs: list[KernelConfig], workload: Workload, rounds: int) -> list[Measurement]:
        out = self._call("remeasure", (cfgs, workload, rounds), self.timeout_s * max(1, len(cfgs)))
        return out if isinstance(out, list) else [out] * len(cfgs)

    def compile_ahead(self, cfg: KernelConfig, workload: Workload) -> None:
        if self._build is not None:
            self._build(cfg, workload.q_len, self.limits.arch, kv_dtype=workload.kv_dtype, **self._kwargs)

    def close(self) -> None:
        """Ask a ready child to exit; one still starting is killed (it reads nothing until it is
        ready: a caller stopping early -- a database not upgraded -- would wait out its start)."""
        if self._proc is not None and self._proc.is_alive() and self._ready:
            try:
                self._conn.send(("close",))
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(10)
        self._kill()
