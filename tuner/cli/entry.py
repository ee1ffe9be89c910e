"""The `tuner` console script. The bare package is the worker client; the CLI needs the server
extra, and an install without it gets one line saying so instead of a traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from verify_tuner.cli.commands import main as cli_main
    except ModuleNotFoundError as exc:
        if exc.name in {"click", "sqlalchemy", "alembic", "fastapi", "uvicorn", "pydantic", "optuna"}:
            sys.exit(f"Error: the tuner CLI needs {exc.name}: pip install 'verify-tuner[server]'")
        raise
    cli_main()
