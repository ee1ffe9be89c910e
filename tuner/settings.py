"""The one settings object. Every TUNER_* environment variable is read here and nowhere else."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platformdirs import user_cache_dir, user_data_dir
from verify_tuner.errors import BadSetting
from verify_tuner.study_files import default_study_storage, study_storage_error

APP = "verify-tuner"
MIN_TOKEN_LEN = 16
#: Characters a token must keep once common passwords and runs (1234, aaaa, abcd) are taken out.
MIN_TOKEN_RANDOM = 12
#: Words that make a token guessable whatever surrounds them (the top of every leaked-password list).
COMMON_WORDS = (
    "password",
    "passwd",
    "passw0rd",
    "secret",
    "changeme",
    "letmein",
    "qwerty",
    "asdf",
    "admin",
    "welcome",
    "default",
    "iloveyou",
)
TOKEN_HOWTO = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"


def default_database_url() -> str:
    """SQLite in the per-user data dir, e.g. ~/.local/share/verify-tuner/configs.db on Linux."""
    return f"sqlite:///{Path(user_data_dir(APP)) / 'configs.db'}"


@dataclass(frozen=True)
class Settings:
    database_url: str = field(default_factory=default_database_url)
    #: Optuna storage URL, or a template with {study} in an SQLite file name (a file per key);
    #: None means the default (verify_tuner.study_files.default_study_storage): a file per key beside an
    #: SQLite config database, a PostgreSQL config database itself.
    study_storage: str | None = None
    host: str = "127.0.0.1"
    port: int = 8177
    #: A second port that answers only /healthz and /readyz, from its own thread: a kubelet's probe
    #: is then answered while the main port is saturated (api/health_server.py). None: no second port.
    health_port: int | None = None
    #: Bearer token for the write endpoints; None turns them off.
    write_token: str | None = None
    cache_dir: Path = field(default_factory=lambda: Path(user_cache_dir(APP)) / "cubins")
    #: The GPU this sidecar answers for when a request names none.
    device: str | None = None
    #: The database is meant to be read-only (a baked or read-only-mounted snapshot): the sidecar
    #: stays ready on it. Otherwise a database that cannot be written is a fault /readyz reports.
    database_read_only: bool = False
    #: The largest request body the sidecar reads (an import): larger ones are a 413 before they are read.
    max_body_bytes: int = 16 * 1024 * 1024
    #: Seconds the sidecar gives the database per call (a connect, a statement, a lookup, /readyz):
    #: past it the database counts as down (stale answers, 503s) instead of holding requests.
    db_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        for name, url in (("TUNER_DATABASE_URL", self.database_url), ("TUNER_STUDY_STORAGE", self.study_storage)):
            if url is None:
                continue
            try:
                make_url(url)
            except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
                detail = f" ({exc})" if isinstance(exc, ValueError) else ""
                raise BadSetting(
                    f"{name} is not a database URL: {masked_url(url)!r}{detail} (e.g. "
                    "sqlite:////var/lib/tuner/configs.db or postgresql+psycopg://user@host/db)"
                ) from None
        if self.study_storage is not None and (why := study_storage_error(self.study_storage)):
            raise BadSetting(f"TUNER_STUDY_STORAGE: {why}")
        if not (0 < self.db_timeout_s <= 600):
            raise BadSetting(f"TUNER_DB_TIMEOUT_S must be a number of seconds in (0, 600], got {self.db_timeout_s}")
        if not 1 <= self.port <= 65535:  # uvicorn would bind a random port for 0 and fail obscurely outside
            raise BadSetting(f"the port (TUNER_PORT or --port) must be 1..65535, got {self.port}")
        if self.health_port is not None and not 1 <= self.health_port <= 65535:
            raise BadSetting(f"TUNER_HEALTH_PORT must be 1..65535 and not the main port, got {self.health_port}")
        self._check_token()

    def _check_token(self) -> None:
        if self.write_token is None:
            return
        # a token read from a file keeps its newline, and a header cannot carry non-ASCII: both never match
        if not all("!" <= ch <= "~" for ch in self.write_token):
            raise BadSetting(
                "TUNER_WRITE_TOKEN must be printable ASCII without spaces or line breaks (a trailing newline "
                "from a secret file?): a client could never send it"
            )
        if len(self.write_token) < MIN_TOKEN_LEN:
            raise BadSetting(
                f"TUNER_WRITE_TOKEN must be at least {MIN_TOKEN_LEN} characters (got "
                f"{len(self.write_token)}): a short token is guessable; make one with {TOKEN_HOWTO}"
            )
        if len(_unguessable_part(self.write_token)) < MIN_TOKEN_RANDOM:
            raise BadSetting(
                "TUNER_WRITE_TOKEN is guessable (a common password, or runs such as 1234 or aaaa, make up most "
                f"of it): make a random one with {TOKEN_HOWTO}"
            )

    @property
    def studies(self) -> str:
        """The study storage URL (or per-key template) the tuner uses."""
        return self.study_storage or default_study_storage(self.database_url)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        kwargs: dict[str, Any] = {}  # each checked as it is read, and all of them by __post_init__
        if v := env.get("TUNER_DATABASE_URL"):
            kwargs["database_url"] = v
        if v := env.get("TUNER_STUDY_STORAGE"):
            kwargs["study_storage"] = v
        if v := env.get("TUNER_HOST"):
            kwargs["host"] = v
        if v := env.get("TUNER_PORT"):
            if not (v.isascii() and v.isdigit()):
                raise BadSetting(f"TUNER_PORT must be an integer port number 1..65535, got {v!r}")
            kwargs["port"] = int(v)
        if v := env.get("TUNER_HEALTH_PORT"):
            if not (v.isascii() and v.isdigit()):
                raise BadSetting(f"TUNER_HEALTH_PORT must be an integer port number 1..65535, got {v!r}")
            kwargs["health_port"] = int(v)
        if v := env.get("TUNER_MAX_BODY_BYTES"):
            if not (v.isascii() and v.isdigit()) or int(v) < 1:
                raise BadSetting(f"TUNER_MAX_BODY_BYTES must be a positive number of bytes, got {v!r}")
            kwargs["max_body_bytes"] = int(v)
        if v := env.get("TUNER_DB_TIMEOUT_S"):
            try:
                kwargs["db_timeout_s"] = float(v)
            except ValueError:
                raise BadSetting(f"TUNER_DB_TIMEOUT_S must be a number of seconds, got {v!r}") from None
        if v := env.get("TUNER_WRITE_TOKEN"):
            kwargs["write_token"] = v
        if v := env.get("TUNER_CACHE_DIR"):
            kwargs["cache_dir"] = Path(v)
        if v := env.get("TUNER_DEVICE"):
            kwargs["device"] = v
        if v := env.get("TUNER_DATABASE_READ_ONLY"):
            if v.lower() not in ("1", "true", "yes", "0", "false", "no"):
                raise BadSetting(f"TUNER_DATABASE_READ_ONLY must be 1/true/yes or 0/false/no, got {v!r}")
            kwargs["database_read_only"] = v.lower() in ("1", "true", "yes")
        return cls(**kwargs)

    def with_overrides(self, **changes: object) -> Settings:
        from dataclasses import replace

        given: dict[str, Any] = {k: v for k, v in changes.items() if v is not None}
        return replace(self, **given)

    def check_ports(self) -> None:
        """The health port is not the main port: checked once `serve --port` has been applied (the
        environment alone was checked before, refusing TUNER_HEALTH_PORT=8177 with --port 8190)."""
        if self.health_port is not None and self.health_port == self.port:
            raise BadSetting(f"TUNER_HEALTH_PORT must be 1..65535 and not the main port, got {self.health_port}")


def masked_url(url: str) -> str:
    """A database URL as text an operator may see, its password (between `user:` and the last `@`)
    starred: for a URL that SQLAlchemy cannot parse, so cannot mask itself (a port that is not a number)."""
    return re.sub(r"^([^:/]*://[^:/@]*:).*@", r"\1***@", url)  # to the last @: over-masking is safe


def _unguessable_part(token: str) -> str:
    """`token` without common passwords and without runs of 4+ characters that repeat or count up or
    down (1234, aaaa, dcba): what a guesser's dictionary and rules do not give away."""
    text = token.lower()
    for word in COMMON_WORDS:
        text = text.replace(word, "\0")
    out, i = [], 0
    while i < len(text):
        j = i + 1
        step = ord(text[j]) - ord(text[i]) if j < len(text) else None
        while step in (-1, 0, 1) and j < len(text) and ord(text[j]) - ord(text[j - 1]) == step:
            j += 1
        run = text[i:j]
        if len(run) < 4:
            out.append(text[i])
            i += 1
        else:
            i = j
    return "".join(out).replace("\0", "")
