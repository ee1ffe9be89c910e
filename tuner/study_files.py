"""Where Optuna's studies live: one storage URL, or a template with one SQLite file per key (the
default beside an SQLite config database). URL logic only -- the sidecar's settings check it
without importing Optuna; verify_tuner.search.study_storage opens the storages."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

#: In a study storage URL, where each key's study name goes: one SQLite file per key, so tuner
#: processes on different keys (the GPUs of one host) never wait on each other's writes.
STUDY = "{study}"


def default_study_storage(database_url: str) -> str:
    """Where Optuna's studies live unless TUNER_STUDY_STORAGE or --storage says: beside an SQLite
    config database, a file per key (`configs.db` -> `configs.studies/{study}.db`); in any other
    config database (PostgreSQL: row locks, one storage for the fleet), that database itself.

    Why a file per key: a key's search writes ~16 rows per measured trial and every refused
    proposal, one SQLite write lock per file, so processes tuning different keys in one file wait
    on each other's locks (the waits, not the syncs, are what slows them)."""
    parsed = make_url(database_url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return database_url
    path = Path(parsed.database)
    return f"sqlite:///{path.with_name(path.stem + '.studies') / (STUDY + '.db')}"


def study_storage_error(url: str) -> str | None:
    """Why `url` cannot be a study storage (None if it can): STUDY belongs in an SQLite file name."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        return f"not a database URL: {url!r} (e.g. sqlite:////var/lib/tuner/studies/{STUDY}.db)"
    if STUDY not in url:
        return None
    if (
        parsed.get_backend_name() != "sqlite"
        or not parsed.database
        or STUDY not in Path(parsed.database).name
        or STUDY in str(Path(parsed.database).parent)
        or parsed.database.count(STUDY) != 1
    ):
        return (
            f"{STUDY} stands for each key's study in the name of an SQLite file, once "
            f"(e.g. sqlite:////var/lib/tuner/studies/{STUDY}.db), not in {url!r}"
        )
    return None


def study_file_url(template: str, study_name: str) -> str:
    """The storage URL of one study: `template` itself, or with STUDY replaced by a file-safe form
    of the name -- readable, and a hash of the exact name so that two names never share a file."""
    if STUDY not in template:
        return template
    safe = re.sub(r"[^A-Za-z0-9.-]+", "_", study_name).strip("_")[:100]
    return template.replace(STUDY, f"{safe}-{zlib.crc32(study_name.encode()):08x}")


def study_urls(template: str) -> list[str]:
    """Every study storage that exists under `template` (the URL itself if it has no STUDY): what
    a report, a bench or `optuna-dashboard` reads. Hidden files and SQLite's -wal/-shm files are
    not studies (a template without an extension matches them too)."""
    if STUDY not in template:
        return [template]
    path = Path(make_url(template).database)  # type: ignore[arg-type]
    if not path.parent.is_dir():
        return []
    return [
        f"sqlite:///{p}"
        for p in sorted(path.parent.glob(path.name.replace(STUDY, "*")))
        if not p.name.startswith(".")  # .blank-optuna-*.db: the empty schema new files copy
        and not p.name.endswith(("-wal", "-shm", "-journal"))
    ]  # SQLite's own, beside a file
