"""Stale-trial handling for every storage: a heartbeat stamped into the trial and a reaper.

Optuna's own heartbeat exists for ``RDBStorage`` only. For a journal file the worker stamps the user
attribute ``_heartbeat`` (unix time) from a daemon thread every ``interval`` seconds; ``reap_stale_trials``
fails RUNNING trials whose stamp is older than ``grace`` and re-enqueues them with the same params
(``storage.enqueue_retry``), as ``RDBStorage`` does with its built-in heartbeat. The stamp is written on
every storage, so a worker can also tell a live trial from a dead one (``silent_trials``) before the grace
period has passed.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings

import optuna
from optuna.storages import JournalStorage
from optuna.trial import FrozenTrial, TrialState

from commrl.sweep.config import HeartbeatConfig
from commrl.sweep.storage import enqueue_retry

HEARTBEAT_ATTR = "_heartbeat"


class TrialHeartbeat:
    """Context manager: a daemon thread stamping ``trial``'s ``_heartbeat`` attribute every ``interval`` s,
    until the trial ends or another worker reaped it (a failed stamp is tried again at the next interval)."""

    def __init__(self, trial: optuna.Trial, interval: float):
        self.trial = trial
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-trial{trial.number}", daemon=True)

    def _run(self) -> None:
        while True:
            try:
                self.trial.set_user_attr(HEARTBEAT_ATTR, time.time())
            except optuna.exceptions.UpdateFinishedTrialError:
                return  # another worker reaped this trial; nothing left to stamp
            except Exception as err:  # transient: NFS, a lock, a lost DB connection; stamp again
                print(
                    f"heartbeat of trial {self.trial.number}: {type(err).__name__}: {err}; "
                    f"trying again in {self.interval} s",
                    file=sys.stderr,
                )
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> TrialHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def last_heartbeat(trial: FrozenTrial) -> float:
    """The newest sign of life of a trial: its stamp, or when it started (a retry inherits an old stamp)."""
    started = trial.datetime_start.timestamp() if trial.datetime_start else 0.0
    return max(float(trial.user_attrs.get(HEARTBEAT_ATTR, 0.0)), started)


def silent_trials(study: optuna.Study, heartbeat: HeartbeatConfig) -> list[int]:
    """RUNNING trials that stamp no heartbeat for two intervals (watched now): probably dead, and reaped
    once ``grace`` has passed. A live trial stamps every interval; one killed a moment ago looks alive
    until it has been watched this long."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    before = {t.number: last_heartbeat(t) for t in running}
    if not before:
        return []
    time.sleep(2 * heartbeat.interval)
    after = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return [t.number for t in after if t.number in before and last_heartbeat(t) <= before[t.number]]


def reap_stale_trials(study: optuna.Study, heartbeat: HeartbeatConfig, now: float | None = None) -> list[int]:
    """Fail RUNNING trials silent for longer than ``grace`` and enqueue their retries; returns their numbers.

    For ``RDBStorage`` this is Optuna's ``fail_stale_trials`` (its own heartbeat table). For a journal file
    the ``_heartbeat`` stamps decide; a trial another worker reaped or finished first is skipped. Either way
    a trial gets one retry, however many paths see it die (``enqueue_retry``).
    """
    storage = study._storage  # the one private attribute used: Optuna exposes no public setter of trial state
    if not isinstance(storage, JournalStorage):
        before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        after = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
        return sorted(after - before)
    now = time.time() if now is None else now
    reaped = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if now - last_heartbeat(trial) <= heartbeat.grace:
            continue
        # the retry first: a reaper killed in between leaves the trial RUNNING with its retry queued, and the
        # next reaper only fails it (failed first, the trial would stay FAIL with no retry)
        enqueue_retry(study, trial, heartbeat)
        try:
            if not storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        reaped.append(trial.number)
    return reaped
