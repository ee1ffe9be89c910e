"""/readyz answers from a record a thread keeps current (api/readiness.py): never older than
its bound, not-ready as soon as a probe runs past the deadline, and file facts checked live."""

from __future__ import annotations

import os
import threading
import time

import pytest
from fastapi.testclient import TestClient
from verify_tuner.api import readiness as readiness_module
from verify_tuner.api.app import create_app
from verify_tuner.api.readiness import Readiness
from verify_tuner.settings import Settings
from verify_tuner.store import migrate
from verify_tuner.store.health import DatabaseHealth

from tests.helpers import eventually

READY = DatabaseHealth(True, True)


class Clock:
    """The readiness clock, moved by hand: staleness without waiting for it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Probe:
    """A probe that answers READY, or blocks while `hold` is set (a database that went quiet)."""

    def __init__(self) -> None:
        self.calls = 0
        self.hold = threading.Event()
        self.release = threading.Event()
        self.entered = threading.Event()

    def __call__(self, url: str, **_: object) -> DatabaseHealth:
        self.calls += 1
        if self.hold.is_set():
            self.entered.set()
            self.release.wait(10)
        return READY


@pytest.fixture
def sqlite_db(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    migrate.upgrade(url)
    return url


def _readiness(url: str, probe: Probe, clock: Clock, every_s: float = 0.05) -> Readiness:
    r = Readiness(Settings(database_url=url, db_timeout_s=2.0), every_s=every_s, probe_fn=probe, clock=clock)
    r.start()
    return r


def test_answers_from_the_record_without_probing(sqlite_db):
    probe, clock = Probe(), Clock()
    r = _readiness(sqlite_db, probe, clock, every_s=60)  # one probe at start, the next a minute later
    try:
        for _ in range(100):
            assert r.answer()[0] == 200
        assert probe.calls == 1
    finally:
        r.stop()


def test_a_probe_past_the_deadline_is_not_ready_at_once(sqlite_db):
    probe, clock = Probe(), Clock()
    r = _readiness(sqlite_db, probe, clock)
    try:
        probe.hold.set()
        assert probe.entered.wait(5)  # the next probe hangs
        assert r.answer()[0] == 200  # within the deadline: the last record stands
        clock.now += 2.1
        status, body = r.answer()
        assert status == 503 and "did not answer within 2 s" in body["reason"], body
        probe.hold.clear()
        probe.release.set()
        eventually(lambda: r.answer()[0] == 200, "ready again once a probe answers in time")
    finally:
        probe.release.set()
        r.stop()


def test_an_answer_that_came_past_the_deadline_is_no_answer(sqlite_db):
    clock = Clock()

    def slow(url: str, **_: object) -> DatabaseHealth:
        clock.now += 2.5  # the probe took 2.5 s of a 2 s deadline
        return READY

    r = Readiness(Settings(database_url=sqlite_db, db_timeout_s=2.0), every_s=60, probe_fn=slow, clock=clock)
    r.start()
    try:
        status, body = r.answer()
        assert status == 503 and "did not answer within 2 s" in body["reason"], body
    finally:
        r.stop()


def test_a_stalled_refresher_is_not_ready_after_the_bound(sqlite_db):
    probe, clock = Probe(), Clock()
    r = _readiness(sqlite_db, probe, clock, every_s=60)  # the thread waits between probes: no probe in flight
    try:
        clock.now += r.bound_s - 0.01
        assert r.answer()[0] == 200
        clock.now += 0.02
        status, body = r.answer()
        assert status == 503 and "last checked" in body["reason"], body
    finally:
        r.stop()


def test_file_facts_are_checked_on_each_answer(sqlite_db, tmp_path):
    probe, clock = Probe(), Clock()
    r = _readiness(sqlite_db, probe, clock, every_s=60)
    db = tmp_path / "c.db"
    try:
        os.replace(db, tmp_path / "moved.db")
        status, body = r.answer()
        assert status == 503 and "missing" in body["reason"]
        migrate.upgrade(sqlite_db)  # a new file at the path: the record is about the old one
        status, body = r.answer()
        assert status == 503 and "replaced" in body["reason"], body
        eventually(lambda: r.answer()[0] == 200, "the new file is probed at once, not a minute later")
    finally:
        r.stop()


def test_readyz_turns_503_when_the_probe_hangs(sqlite_db, monkeypatch):
    probe = Probe()
    monkeypatch.setattr(readiness_module, "probe", probe)
    app = create_app(Settings(database_url=sqlite_db, device="h200", db_timeout_s=0.3))
    with TestClient(app) as c:
        assert c.get("/readyz").status_code == 200
        probe.hold.set()
        t0 = time.monotonic()
        ready = eventually(lambda: (x := c.get("/readyz")).status_code == 503 and x, "never 503")
        took = time.monotonic() - t0  # the next probe starts within EVERY_S, and is late 0.3 s later
        assert took < readiness_module.EVERY_S + 0.3 + 0.5, took
        # a thread starved past EVERY_S + 0.3 s (a loaded machine) is the stale record's 503 instead
        assert any(why in ready.json()["reason"] for why in ("did not answer", "last checked")), ready.text
        assert c.get("/healthz").status_code == 200  # alive, only not ready
        probe.release.set()
