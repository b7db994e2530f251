"""Optuna storages shared by the workers of a study.

- One machine: ``sqlite:///results/optuna/<pair>.db`` (local disk) as ``RDBStorage`` with Optuna's heartbeat
  (and a file lock that makes trial state changes atomic between processes: ``SQLiteStorage``);
  a RUNNING trial whose worker died is failed after ``grace`` seconds and retried with the same params by
  ``enqueue_retry`` (``RetryHeartbeatStaleTrialCallback``, once per trial) the next time any worker looks
  (Optuna 5's ``heartbeat_stale_trial_callback``; the old ``failed_trial_callback`` is deprecated).
- Several nodes: never sqlite on a shared filesystem (its locks are unreliable over NFS). Either a journal
  file on the shared filesystem (``JournalFileBackend``, symlink lock; Optuna has no heartbeat for it, so
  ``commrl.sweep.heartbeat`` stamps and reaps trials itself) or a PostgreSQL/MySQL URL (``RDBStorage`` with
  the built-in heartbeat).
"""

from __future__ import annotations

import copy
import fcntl
import functools
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from commrl.sweep.config import HeartbeatConfig, StorageSpec

SQLITE_BUSY_TIMEOUT_S = 60  # sqlite waits this long for a lock (default 5 s: too short for several writers)


def enqueue_retry(study: optuna.Study, trial: FrozenTrial, heartbeat: HeartbeatConfig) -> bool:
    """Queue the retry of failed or stale ``trial`` (``RetryHeartbeatStaleTrialCallback``: its params, user
    attributes and intermediate values) unless a trial retries it already; returns whether one does now (none
    is queued once the chain has had its ``heartbeat.max_retry`` retries).

    Three paths queue retries, each when it sees a trial die: the preempt path (before Optuna's tell marks the
    trial FAIL), Optuna's RDB heartbeat (``retry_callback``) and the journal reaper. A worker killed between
    the first and its tell leaves the trial RUNNING and then stale: the reaper must not queue a second retry.
    """
    if retry_of(study.get_trials(deepcopy=False), trial.number) is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            callback = RetryHeartbeatStaleTrialCallback(
                max_retry=heartbeat.max_retry, inherit_intermediate_values=True
            )
        callback(study, copy.deepcopy(trial))  # a copy: it appends to the history list of the trial it gets
    return retry_of(study.get_trials(deepcopy=False), trial.number) is not None


def retry_callback(heartbeat: HeartbeatConfig) -> Callable[[optuna.Study, FrozenTrial], None]:
    """``enqueue_retry`` as the stale-trial callback of ``RDBStorage``."""
    return functools.partial(enqueue_retry, heartbeat=heartbeat)


def retry_of(trials: list[FrozenTrial], number: int) -> FrozenTrial | None:
    """The retry of trial ``number``: the first trial (by number) that retries it; None if none does."""
    return next((t for t in trials if retry_history(t)[-1:] == [number]), None)


def retry_history(trial: FrozenTrial) -> list[int]:
    """The trials this one retries, oldest first (empty for a fresh trial); the first names the folder."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryHeartbeatStaleTrialCallback.retry_history(trial)


class StampingRDBStorage(RDBStorage):
    """``RDBStorage`` whose heartbeat stamp survives an error. Optuna's heartbeat thread calls
    ``record_heartbeat`` with no handler: one failed stamp (a dropped database connection, a locked sqlite
    file) ends the thread for good, and after ``heartbeat.grace`` another worker reaps the live trial and
    trains its retry beside it. Here a failed stamp is reported and the next one, an interval later, tries
    again (as the journal's ``TrialHeartbeat`` does)."""

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            super().record_heartbeat(trial_id)
        except Exception as err:
            print(
                f"heartbeat of trial id {trial_id}: {type(err).__name__}: {err}; trying again in "
                f"{self.heartbeat_interval} s",
                file=sys.stderr,
            )


class SQLiteStorage(StampingRDBStorage):
    """``RDBStorage`` on a sqlite file, with trial state changes made atomic between processes.

    Optuna reads a trial's state and changes it under ``SELECT ... FOR UPDATE``, which sqlite ignores: two
    workers asking at the same moment can both move the same WAITING trial to RUNNING and train it twice
    (seen here with the enqueued defaults), and two reapers can both fail a stale trial and enqueue two
    retries. A file lock beside the database (``<db>.lock``, ``flock``; sqlite is for one machine anyway)
    serialises every state change, so the second worker sees the new state and moves on.
    """

    def __init__(self, url: str, lock_path: Path, **kwargs):
        super().__init__(url, **kwargs)
        self.lock_path = lock_path

    def set_trial_state_values(self, trial_id: int, state: TrialState, values=None) -> bool:
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return super().set_trial_state_values(trial_id, state, values)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def open_storage(spec: StorageSpec, heartbeat: HeartbeatConfig, create_dirs: bool = False) -> BaseStorage:
    """The Optuna storage of ``spec``; ``create_dirs`` makes the folder of a sqlite DB or journal file."""
    if spec.kind == "journal":
        path = Path(spec.location)
        if create_dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    options = {
        "heartbeat_interval": heartbeat.interval,
        "grace_period": heartbeat.grace,
        "heartbeat_stale_trial_callback": retry_callback(heartbeat),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if not spec.location.startswith("sqlite:///"):
            return StampingRDBStorage(spec.location, **options)
        db = Path(spec.location.removeprefix("sqlite:///"))
        if create_dirs:
            db.parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
        lock = db.with_name(db.name + ".lock")
        return SQLiteStorage(spec.location, lock, engine_kwargs=engine_kwargs, **options)


def storage_exists(spec: StorageSpec) -> bool:
    """Whether a file-based storage is there already (an RDB server is assumed to exist)."""
    if spec.kind == "journal":
        return Path(spec.location).is_file()
    if spec.location.startswith("sqlite:///"):
        return Path(spec.location.removeprefix("sqlite:///")).is_file()
    return True


def study_names(storage: BaseStorage) -> list[str]:
    return [s.study_name for s in storage.get_all_studies()]
