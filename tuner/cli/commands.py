"""`tuner` command line: a thin layer that parses, calls the library and prints. This module holds
the root group and its --database-url; each command group lives in a module of its own (db, serve,
device, configs, study, plans)."""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

import click
from verify_tuner.cli import configs as cli_configs
from verify_tuner.cli import db as cli_db
from verify_tuner.cli import device as cli_device
from verify_tuner.cli import plans as cli_plans
from verify_tuner.cli import serve as cli_serve
from verify_tuner.cli import study as cli_study
from verify_tuner.cli.database import database_url_option, url_problem
from verify_tuner.errors import TunerError
from verify_tuner.settings import Settings


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="verify-tuner", message="%(prog)s %(version)s")
@click.option(
    "--database-url",
    default=None,
    callback=database_url_option,
    help="SQLAlchemy URL of the config database (default: TUNER_DATABASE_URL, else SQLite in the user data dir).",
)
@click.pass_context
def cli(ctx: click.Context, database_url: str | None) -> None:
    """Auto-tuner and config service for the MLA verify-attention kernel."""
    env = {k: v for k, v in os.environ.items() if not (database_url and k == "TUNER_DATABASE_URL")}  # overridden
    try:
        ctx.obj = Settings.from_env(env).with_overrides(database_url=database_url)
    except TunerError as exc:
        raise click.ClickException(str(exc)) from None
    if database_url is None and (why := url_problem(ctx.obj.database_url)):
        raise click.ClickException(f"TUNER_DATABASE_URL: {why}")
    if ctx.obj.study_storage is not None and (why := url_problem(ctx.obj.study_storage)):
        raise click.ClickException(f"TUNER_STUDY_STORAGE: {why}")  # a mysql:// URL was Optuna's ImportError


for group in (cli_db.db, cli_serve.serve, cli_device.device, cli_configs.configs, cli_study.study):
    cli.add_command(group)
cli_plans.register_study(cli_study.study)  # `study graph-plan`
cli_plans.register_configs(cli_configs.configs)  # `configs verify`


class _Output:
    """sys.stdout, whose write errors say they are the output's: `tuner configs list > /dev/full`
    raised a bare OSError (no file name), which read as a bug of ours and printed a traceback."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: Any) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise OutputError(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise OutputError(exc) from None

    @property
    def buffer(self) -> _Output:
        # click writes through its own text stream on this when the encoding is ASCII (LC_ALL=C)
        return _Output(self._stream.buffer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class OutputError(Exception):
    def __init__(self, exc: OSError) -> None:
        super().__init__(exc.strerror or str(exc))
        self.errno = exc.errno


def main() -> None:
    real = sys.stdout
    sys.stdout = _Output(real)
    code = 0
    try:
        cli(prog_name="tuner")
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if done.code is not None and not isinstance(done.code, int):
            print(done.code, file=sys.stderr)
    except OutputError as exc:
        code = _output_failed(exc)
    try:
        sys.stdout.flush()
    except OutputError as exc:
        code = code or _output_failed(exc)
    finally:
        sys.stdout = real
    if code:
        _quiet_exit(real)
    sys.exit(code)


def _output_failed(exc: OutputError) -> int:
    if exc.errno == errno.EPIPE:  # `tuner configs list | head`: the reader has what it wanted
        return 141  # as a shell reports SIGPIPE
    print(f"Error: cannot write the output: {exc}", file=sys.stderr)
    return 1


def _quiet_exit(stream: Any) -> None:
    """Whatever output is still buffered is dropped: flushing it at exit would fail again, loudly."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    except (OSError, ValueError):
        pass
