"""Optuna storages shared by the workers of a study.

- One machine: ``sqlite:///results/optuna/<pair>.db`` (local disk) as ``RDBStorage`` with Optuna's heartbeat
  (and a file lock that makes trial state changes atomic between processes: ``SQLiteStorage``);
  a RUNNING trial whose worker died is failed after ``grace`` seconds and retried with the same params by
  ``RetryHeartbeatStaleTrialCallback`` the next time any worker looks (Optuna 5's name; the old
  ``failed_trial_callback`` is deprecated).
- Several nodes: never sqlite on a shared filesystem (its locks are unreliable over NFS). Either a journal
  file on the shared filesystem (``JournalFileBackend``, symlink lock; Optuna has no heartbeat for it, so
  ``commrl.sweep.heartbeat`` stamps and reaps trials itself) or a PostgreSQL/MySQL URL (``RDBStorage`` with
  the built-in heartbeat).
"""

from __future__ import annotations

import fcntl
import warnings
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from commrl.sweep.config import HeartbeatConfig, StorageSpec

SQLITE_BUSY_TIMEOUT_S = 60  # sqlite waits this long for a lock (default 5 s: too short for several writers)


def retry_callback(heartbeat: HeartbeatConfig) -> RetryHeartbeatStaleTrialCallback:
    """Re-enqueue a stale trial with its params, user attributes and intermediate values."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryHeartbeatStaleTrialCallback(
            max_retry=heartbeat.max_retry, inherit_intermediate_values=True
        )


def enqueue_retry(study: optuna.Study, trial: FrozenTrial, heartbeat: HeartbeatConfig) -> bool:
    """Queue the retry of ``trial`` (``retry_callback``); returns whether the study now holds one (the
    callback queues none once the chain has had its ``heartbeat.max_retry`` retries)."""
    retry_callback(heartbeat)(study, trial)
    return any(retry_history(t)[-1:] == [trial.number] for t in study.get_trials(deepcopy=False))


def retry_history(trial: FrozenTrial) -> list[int]:
    """The trials this one retries, oldest first (empty for a fresh trial); the first names the folder."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryHeartbeatStaleTrialCallback.retry_history(trial)


class SQLiteStorage(RDBStorage):
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
            return RDBStorage(spec.location, **options)
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
