"""What a client of either port is told of a database failure, and where the rest goes.

The main port's error bodies and stale header, and /readyz on both ports, answer without a token
(only a request that passed the write token's check reads the detail):
they showed the absolute SQLite path, the PostgreSQL user, host, port and database name, driver
exception names and SQLAlchemy's links. A client now reads one of a few fixed phrases (the kind
of failure and, where there is one, the fix); the detail goes to the sidecar's log, once a minute
per distinct detail, so an outage under load does not flood it.
"""

from __future__ import annotations

import logging
import re
import threading
import time

log = logging.getLogger("verify_tuner.api")

GENERIC = "the database cannot be used (the sidecar's log says why)"
#: Seconds between two log lines of one detail.
LOG_EVERY_S = 60.0

#: (what a detail contains, what the client reads); first match wins, and nothing of the detail
#: is copied but the deadline's seconds.
_KINDS = (
    (re.compile(r"rolled back, nothing stored"), None),
    (re.compile(r"whether it was stored is unknown"), None),
    (re.compile(r"did not answer within ([0-9.]+) s"), "the database did not answer within {} s"),
    (re.compile(r"was replaced: re-checking"), "the database file was replaced: re-checking it"),
    (re.compile(r"database file .* is missing|no database at"), "the database file is missing"),
    (re.compile(r"read-only|readonly"), "the database is read-only"),
    (
        re.compile(r"this version needs|this version does not know|tuner db upgrade"),
        "the database schema is not this version's (`tuner db upgrade`; the sidecar's log says more)",
    ),
    (re.compile(r"^readiness not checked yet$"), "readiness not checked yet"),
    (re.compile(r"^readiness last checked ([0-9.]+) s ago$"), "readiness last checked {} s ago"),
)

_lock = threading.Lock()
_logged: dict[str, float] = {}


def client_reason(detail: str | None) -> str:
    """The phrase a client reads for `detail` (a failure's full text, which is logged instead)."""
    text = detail or ""
    for pattern, phrase in _KINDS:
        m = pattern.search(text)
        if m is None:
            continue
        if phrase is None:  # our own sentence about a write's fate: it names nothing of the deployment
            return _own_sentence(text)
        return phrase.format(*m.groups())
    return GENERIC


def _own_sentence(text: str) -> str:
    """A write's fate as write_within says it, from "the import"/"the delete" on (a prefix the
    exception handler adds is dropped)."""
    m = re.search(r"the (import|delete) (did not finish within [0-9.]+ s|was committing).*", text)
    return m.group(0) if m else GENERIC


def log_detail(detail: str, *, level: int = logging.WARNING) -> None:
    """Log `detail` unless it was logged in the last LOG_EVERY_S seconds."""
    now = time.monotonic()
    with _lock:
        if now - _logged.get(detail, -LOG_EVERY_S) < LOG_EVERY_S:
            return
        if len(_logged) > 1000:  # details that carry numbers must not grow this for ever
            _logged.clear()
        _logged[detail] = now
    log.log(level, "%s", detail)


def tell(detail: str) -> str:
    """client_reason, with the detail logged for the operator."""
    log_detail(detail)
    return client_reason(detail)
