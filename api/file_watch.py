"""The SQLite file behind the sidecar's engines, followed by path. A file deleted or replaced
under a running sidecar (a restore, `rm` then `tuner db upgrade`) stays open in its pooled
connections: without this the sidecar would keep serving, and importing into, a file nobody can
see any more, while /readyz (a new connection) reported the new one ready."""

from __future__ import annotations

import os
from collections.abc import Callable
from enum import Enum
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.engine import make_url


class FileState(Enum):
    SAME = "same"  # the path names the file the engines opened (or the database is not a file)
    MISSING = "missing"
    REPLACED = "replaced"  # another file is at the path now: the engines have let the old one go
    #: the same file, written since the last check (its size, mtime or ctime moved): by SQLite (a
    #: checkpoint) or by something else -- `cp new.db live.db` rewrites it in place, and two
    #: snapshots can carry the same data stamp, so only the file says the data changed
    WRITTEN = "written"


class FileWatch:
    def __init__(self, url: str, engines: list[Engine], on_new_data: Callable[[], None] = lambda: None) -> None:
        """`on_new_data` runs when a check, whoever makes it, finds the file replaced or written: the
        sidecar's cached tables go with the pooled connections (a check by a rejected import once
        reset only the pools, and the old file's tables were served on under the same data stamp)."""
        parsed = make_url(url)
        is_file = parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:")
        self.path = Path(parsed.database).expanduser().resolve() if is_file else None  # type: ignore[arg-type]
        self.engines, self.on_new_data = engines, on_new_data
        self._identity, self._content = self._stat() if self.path is not None else (None, None)

    def _stat(self) -> tuple[tuple[int, int] | None, tuple[int, int, int] | None]:
        """The file's identity (device, inode) and what moves when it is written (size, mtime, ctime)."""
        try:
            st = os.stat(self.path)  # type: ignore[arg-type]
        except FileNotFoundError:
            return None, None
        return (st.st_dev, st.st_ino), (st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def check(self) -> FileState:
        """Whether the path still names the engines' file, unwritten since the last check. On any
        change the engines' pooled connections are closed, so that the next ones open what the path
        names now (engines made with create=False do not recreate a deleted file) and read it
        afresh: a pooled connection's page cache can outlive a rewrite that kept SQLite's change
        counter."""
        if self.path is None:
            return FileState.SAME
        identity, content = self._stat()
        if identity == self._identity and content == self._content:
            return FileState.MISSING if identity is None else FileState.SAME
        for engine in self.engines:
            engine.dispose()
        state = (
            FileState.MISSING
            if identity is None
            else FileState.REPLACED
            if identity != self._identity
            else FileState.WRITTEN
        )
        self._identity, self._content = identity, content
        if state is not FileState.MISSING:  # a missing file keeps the last good tables, served stale
            self.on_new_data()
        return state

    def missing_reason(self) -> str:
        return f"database file {self.path} is missing"
