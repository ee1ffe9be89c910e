"""Options and ranges that several command groups share."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import click
from verify_tuner.batches import SPREADS
from verify_tuner.kernels.formats import DEFAULT as DEFAULT_KV_DTYPE
from verify_tuner.kernels.formats import KV_DTYPES
from verify_tuner.kernels.timing import MAX_NEIGHBOUR_MB
from verify_tuner.kernels.validate import MAX_Q_LEN
from verify_tuner.keys import MAX_H, check_kv_dtype

_INTEGER = re.compile(r"-?[0-9]+")


def integer(text: str) -> int:
    """An integer as an operator types it, ASCII digits with an optional '-': int() also reads
    '8_0' as 80 and takes ' 8', '+8' and other scripts' digits, which the HTTP API refuses."""
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"{text!r} is not an integer (digits 0-9 only)")
    return int(text)


class Integer(click.IntRange):
    """click.IntRange with integer()'s spelling."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not _INTEGER.fullmatch(value):
            self.fail(f"{value!r} is not an integer (digits 0-9 only)", param, ctx)
        return super().convert(value, param, ctx)

    def _describe_range(self) -> str:
        # unbounded: no range in --help (click wrote "[x<=None]"); the command checks the value itself
        return "" if self.min is None and self.max is None else super()._describe_range()


class Seconds(click.FloatRange):
    """A number of seconds, finite: click's FloatRange lets `inf` and `nan` through, which failed
    only once the GPU worker was up (OverflowError in a selector, or a study of 0 trials)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        out = super().convert(value, param, ctx)
        if not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return out


class Share(click.FloatRange):
    """A share in [0, 1), finite (FloatRange lets `nan` through its bounds)."""

    name = "share"

    def __init__(self) -> None:
        super().__init__(0.0, 1.0, max_open=True)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        out = super().convert(value, param, ctx)
        if not math.isfinite(out):
            self.fail(f"{value!r} is not a share in [0, 1)", param, ctx)
        return out


JSON_OPT = click.option("--json", "as_json", is_flag=True, help="Machine-readable output (JSON).")
H_RANGE = Integer(1, MAX_H)
Q_LEN_RANGE = Integer(1, MAX_Q_LEN)
H_OPT = click.option("--H", "H", type=H_RANGE, required=True, help="Heads per GPU.")
Q_LEN_OPT = click.option("--q-len", type=Q_LEN_RANGE, required=True, help="Draft nodes per request.")
ORDINAL_OPT = click.option(
    "--device", "ordinal", type=Integer(min=0), default=0, show_default=True, help="CUDA device ordinal."
)
NEIGHBOUR_OPT = click.option(
    "--neighbour-mb",
    type=Integer(0, MAX_NEIGHBOUR_MB),
    default=0,
    show_default=True,
    help="Time each launch followed by a bf16 GEMM over this many MB of weights, its own time subtracted: "
    "the rest of an engine's layer, which leaves the kernel's caches cold (more than the L2, e.g. 128 on an "
    "H200). 0: CUDA-graph replays back to back. Stored with every time; a study under one never resumes "
    "one under the other.",
)


def _kv_dtype(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return check_kv_dtype(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


KV_DTYPE_OPT = click.option(
    "--kv-dtype",
    default=DEFAULT_KV_DTYPE,
    show_default=True,
    callback=_kv_dtype,
    help="The KV cache's element format (the engine's --kv-cache-dtype): " + ", ".join(KV_DTYPES) + ".",
)

MEASURE_TIMEOUT_OPT = click.option(
    "--measure-timeout",
    type=Seconds(min=1),
    default=120.0,
    show_default=True,
    help="Seconds before a hanging measurement is killed.",
)


def spread_option(help: str) -> Callable[..., Any]:
    """--spread, how a batch's prefixes are drawn (verify_tuner.batches)."""
    return click.option("--spread", type=click.Choice(list(SPREADS)), default="uniform", show_default=True, help=help)


def with_options(options: list[Callable[..., Any]], fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` decorated with `options`, listed in the order --help shows them."""
    for opt in reversed(options):
        fn = opt(fn)
    return fn
