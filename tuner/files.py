"""The one way files meant for other processes and users are written: whole or not at all, and
never through a link another user planted.

Standard library only: the worker client and the kernel cache use it without the server extra.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

#: Readable by every user: a worker or a tuner running as another user reads these files.
SHARED_MODE = 0o644
#: The folders they lie in, listable and enterable by every user for the same reason.
SHARED_DIR_MODE = 0o755
#: A `mode` of UMASK: what the process's umask allows, as for any file a user's command creates
#: (`tuner configs export`, `dump`, `study report`: the operator's umask 077 keeps them private).
UMASK = None
#: Links followed at most, as the kernel's own limit (ELOOP past it).
MAX_LINKS = 40


def make_shared_dirs(path: Path, *, mode: int | None = SHARED_DIR_MODE) -> None:
    """Create `path` and its missing parents, each level it creates `mode` whatever the umask (UMASK:
    as the umask allows); folders that already exist are left as they are."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:  # another writer made it meanwhile: theirs to set
            continue
        if mode is not None:
            os.chmod(folder, mode)  # mkdir's mode is masked by the umask (0700 under umask 077)


def write_shared(path: Path, data: bytes | str, *, mode: int | None = SHARED_MODE) -> None:
    """Write `data` to `path` atomically and durably, with `mode` whatever the umask (UMASK: as the
    umask allows): a reader sees the old file or the new one, never a part, and the new one survives
    a power cut once this returns. The directory must exist (make_shared_dirs); OSError (with the
    path) when it cannot be written, PermissionError for a link this user must not follow."""
    raw = data.encode() if isinstance(data, str) else data
    # A symlink is followed (the rename would replace the link with a file), and a device, pipe or
    # socket is written as it is: renaming over it replaced /dev/null with a file, as root.
    path = _follow(path)
    try:
        kind = os.stat(path).st_mode
    except FileNotFoundError:
        kind = stat.S_IFREG
    if not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)  # a link swapped in since _follow: ELOOP, not followed
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        return
    fd, tmp = _temporary(path, 0o666 if mode is None else 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)  # a reader as another user would be refused the 0600 it was made
            os.fsync(f.fileno())
        os.replace(tmp, path)  # a rename never follows a link: one planted at `path` since is replaced
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _follow(path: Path) -> Path:
    """The file `path` names, its links followed as the kernel's fs.protected_symlinks follows them in
    a sticky world-writable folder, here in every folder: only a link owned by this user or by the
    folder's owner. write_shared resolves links itself, so the kernel never saw an open through one:
    root's export through `configs.json -> /etc/secret.conf`, planted by `nobody` in /tmp, replaced
    the secret with JSON."""
    for _ in range(MAX_LINKS):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return path
        if not stat.S_ISLNK(st.st_mode):
            return path
        folder = os.stat(path.parent)
        if st.st_uid not in (os.geteuid(), folder.st_uid):
            raise PermissionError(
                errno.EACCES,
                f"not written: it is a symbolic link owned by uid {st.st_uid}, neither this user "
                f"({os.geteuid()}) nor the folder's owner ({folder.st_uid}), so another user may have "
                "planted it; remove it or write elsewhere",
                str(path),
            )
        path = path.parent / os.readlink(path)  # a relative target is relative to the link's folder
    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))


def _temporary(path: Path, create_mode: int) -> tuple[int, str]:
    """A new file beside `path` (O_EXCL: never one that exists, nor a link), opened for writing."""
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, create_mode), tmp
        except FileExistsError:
            continue
        except OSError as exc:  # name the file asked for, not the temporary one
            raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
    raise FileExistsError(errno.EEXIST, "no unused temporary name", str(path))


def _fsync_dir(directory: Path) -> None:
    """The rename itself is durable only once its directory is synced."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_umask() -> bool:
    """Whether the umask keeps other users from reading what this process creates (worth a note when
    the files are for workers that may run as another user). Linux reports it in /proc; elsewhere
    it is read by setting and restoring it, before any other thread could create a file."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return bool(int(line.split()[1], 8) & 0o004)
    except OSError:
        pass
    current = os.umask(0o022)
    os.umask(current)
    return bool(current & 0o004)
