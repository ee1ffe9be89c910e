"""The SQLite file behind the sidecar's engines, followed by path. A file deleted or replaced
under a running sidecar (a restore, `rm` then `tuner db upgrade`) stays open in its pooled
connections: without this the sidecar would keep serving, and importing into, a file nobody can
see any more, while /readyz (a new connection) reported the new one ready."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.engine import make_url


class FileState(Enum):
    SAME = "same"  # the path names the file the engines opened (or the database is not a file)
    MISSING = "missing"
    REPLACED = "replaced"  # another file is at the path now: the engines have let the old one go


class FileWatch:
    def __init__(self, url: str, engines: list[Engine]) -> None:
        parsed = make_url(url)
        is_file = parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:")
        self.path = Path(parsed.database).expanduser().resolve() if is_file else None  # type: ignore[arg-type]
        self.engines = engines
        self._identity = self._stat() if self.path is not None else None

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)  # type: ignore[arg-type]
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def check(self) -> FileState:
        """Whether the path still names the engines' file. On a change (deleted or replaced) the
        engines' pooled connections are closed, so that the next ones open what the path names
        now (engines made with create=False do not recreate a deleted file)."""
        if self.path is None:
            return FileState.SAME
        now = self._stat()
        if now != self._identity:
            for engine in self.engines:
                engine.dispose()
            self._identity = now
            return FileState.MISSING if now is None else FileState.REPLACED
        return FileState.MISSING if now is None else FileState.SAME

    def missing_reason(self) -> str:
        return f"database file {self.path} is missing"
