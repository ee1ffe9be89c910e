"""The one way files meant for other processes and users are written: whole or not at all.

Standard library only: the worker client and the kernel cache use it without the server extra.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

#: Readable by every user: a worker or a tuner running as another user reads these files.
SHARED_MODE = 0o644
#: The folders they lie in, listable and enterable by every user for the same reason.
SHARED_DIR_MODE = 0o755


def make_shared_dirs(path: Path) -> None:
    """Create `path` and its missing parents, each level it creates SHARED_DIR_MODE whatever the
    umask; folders that already exist are left as they are."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:  # another writer made it meanwhile: theirs to set
            continue
        os.chmod(folder, SHARED_DIR_MODE)  # mkdir's mode is masked by the umask (0700 under umask 077)


def write_shared(path: Path, data: bytes | str, *, mode: int = SHARED_MODE) -> None:
    """Write `data` to `path` atomically and durably, with `mode` whatever the umask: a reader sees
    the old file or the new one, never a part, and the new one survives a power cut once this returns.
    The directory must exist (make_shared_dirs); OSError (with the path) when it cannot be written."""
    raw = data.encode() if isinstance(data, str) else data
    # A symlink is followed (the rename would replace the link with a file), and a device, pipe or
    # socket is written as it is: renaming over it replaced /dev/null with a file, as root.
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    try:
        kind = os.stat(path).st_mode
    except FileNotFoundError:
        kind = stat.S_IFREG
    if not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):
        with open(path, "wb") as f:
            f.write(raw)
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:  # name the file asked for, not the temporary one
        raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fchmod(f.fileno(), mode)  # mkstemp makes 0600; a reader as another user would be refused
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """The rename itself is durable only once its directory is synced."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
