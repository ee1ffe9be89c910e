"""The heartbeat of this process's trials in flight, which lets processes sharing a study through
its RDB storage fail and queue again the trials of one that was killed."""

from __future__ import annotations

import threading
import time
import warnings
from typing import Self

import optuna


class Heartbeat:
    """Beats this process's trials in flight through the storage's heartbeat (Optuna's optimize
    does this for the trial its objective runs; ask/tell leaves it to the caller), and fails
    other processes' stale trials (fail_stale_trials, whose retry callback queues them again)."""

    def __init__(self, study: optuna.Study, storage: optuna.storages.BaseStorage) -> None:
        self.study, self.storage = study, storage
        interval = storage.get_heartbeat_interval() if isinstance(storage, optuna.storages.RDBStorage) else None
        self.interval = float(interval) if interval else None
        self.study_id = storage.get_study_id_from_name(study.study_name) if self.interval else None
        self.ids: dict[int, int] = {}  # trial number -> trial id
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.checked = float("-inf")
        self.thread = threading.Thread(target=self._beat, name="trial-heartbeat", daemon=True)

    def __enter__(self) -> Self:
        if self.interval:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()

    def add(self, number: int) -> None:
        if self.study_id is None:
            return
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        self.storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
        with self.lock:
            self.ids[number] = trial_id

    def drop(self, number: int) -> None:
        with self.lock:
            self.ids.pop(number, None)

    def fail_stale(self) -> None:
        """Fail trials whose process stopped beating, at most once an interval."""
        if self.interval is None or time.monotonic() - self.checked < self.interval:
            return
        self.checked = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)

    def _beat(self) -> None:
        assert self.interval is not None
        while not self.stop.wait(self.interval):
            with self.lock:
                ids = list(self.ids.values())
            for trial_id in ids:
                self.storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
