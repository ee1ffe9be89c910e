"""SQLite writers queue on a lock file (tuner.db.writer_queue): taken by the statement that starts
a write transaction, released when it ends however it ends; reads never take it; a stuck holder
makes others fail with SQLite's own error instead of hanging."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading

import pytest

from tuner.db.writer_queue import QueuedWriterConnection, lock_path


def _db(tmp_path) -> str:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "w.db")
    c = sqlite3.connect(path)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER)")
    c.commit()
    c.close()
    return path


def _lock_is_free(path: str) -> bool:
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _connect(path: str, timeout: float = 5.0) -> sqlite3.Connection:
    return sqlite3.connect(path, timeout=timeout, factory=QueuedWriterConnection, check_same_thread=False)


def test_a_write_transaction_holds_the_lock_until_commit_or_rollback_and_reads_never_take_it(tmp_path):
    path = _db(tmp_path)
    c = _connect(path)
    c.execute("SELECT count(*) FROM t").fetchone()
    assert _lock_is_free(path)  # a read outside a transaction
    c.execute("INSERT INTO t (v) VALUES (1)")
    assert not _lock_is_free(path)  # the implicit transaction pysqlite began for the INSERT
    c.execute("UPDATE t SET v = 2")
    assert not _lock_is_free(path)
    c.commit()
    assert _lock_is_free(path)
    c.execute("DELETE FROM t")
    c.rollback()
    assert _lock_is_free(path)
    with pytest.raises(sqlite3.OperationalError):
        c.execute("INSERT INTO no_such_table VALUES (1)")  # failed before a transaction began
    assert _lock_is_free(path)
    assert c.execute("SELECT count(*) FROM t").fetchone() == (1,)
    c.close()


def test_an_explicit_immediate_transaction_holds_it_until_its_commit_statement(tmp_path):
    path = _db(tmp_path)
    c = _connect(path)
    c.isolation_level = None  # as the config database's engine: it issues BEGIN IMMEDIATE itself
    c.execute("BEGIN IMMEDIATE")
    assert not _lock_is_free(path)
    c.execute("INSERT INTO t (v) VALUES (1)")
    c.execute("COMMIT")
    assert _lock_is_free(path)
    c.close()


def test_a_waiting_writer_goes_once_the_holder_commits_and_nothing_is_lost(tmp_path):
    path = _db(tmp_path)
    a, b = _connect(path), _connect(path)
    a.execute("INSERT INTO t (v) VALUES (1)")  # a holds the writers' lock
    order: list[str] = []

    def writer_b() -> None:
        b.execute("INSERT INTO t (v) VALUES (2)")
        order.append("b wrote")
        b.commit()

    t = threading.Thread(target=writer_b)
    t.start()
    t.join(0.3)
    assert t.is_alive() and not order  # queued behind a
    order.append("a commits")
    a.commit()
    t.join(10)
    assert not t.is_alive() and order == ["a commits", "b wrote"]
    assert sorted(v for (v,) in a.execute("SELECT v FROM t")) == [1, 2]
    a.close()
    b.close()


def test_a_stuck_holder_fails_others_with_sqlites_error_instead_of_hanging(tmp_path):
    path = _db(tmp_path)
    holder = _connect(path)
    holder.execute("INSERT INTO t (v) VALUES (1)")  # never commits
    waiter = _connect(path, timeout=0.2)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            waiter.execute("INSERT INTO t (v) VALUES (2)")
        except sqlite3.OperationalError as exc:
            errors.append(exc)

    t = threading.Thread(target=write)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the waiting writer hung"
    assert errors and "locked" in str(errors[0])
    holder.rollback()
    holder.close()
    waiter.close()


def test_the_engines_writers_queue_and_read_only_ones_do_not(tmp_path):
    from sqlalchemy import text

    from tuner.db.session import make_engine

    path = tmp_path / "c.db"
    eng = make_engine(f"sqlite:///{path}")
    with eng.begin() as conn:
        conn.execute(text("CREATE TABLE x (a INTEGER)"))
        conn.execute(text("INSERT INTO x VALUES (1)"))
    assert os.path.exists(lock_path(str(path)))
    with eng.connect() as conn:
        assert isinstance(conn.connection.dbapi_connection, QueuedWriterConnection)
    eng.dispose()
    ro = make_engine(f"sqlite:///{path}", read_only=True)
    with ro.connect() as conn:
        assert not isinstance(conn.connection.dbapi_connection, QueuedWriterConnection)
        assert conn.execute(text("SELECT a FROM x")).scalar() == 1
    ro.dispose()
