"""Options and ranges that several command groups share."""

from __future__ import annotations

import click
from verify_tuner.kernels.validate import MAX_Q_LEN
from verify_tuner.keys import MAX_H

JSON_OPT = click.option("--json", "as_json", is_flag=True, help="Machine-readable output (JSON).")
H_RANGE = click.IntRange(1, MAX_H)
Q_LEN_RANGE = click.IntRange(1, MAX_Q_LEN)
