"""Stale trials on a journal file (no heartbeat in Optuna 5): the DIY stamp + reaper fail and retry them,
once each, even when a reaper dies half-way; a failed stamp does not stop the heartbeat of a live trial."""

from __future__ import annotations

import time

import optuna
import pytest
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from sqlalchemy.exc import OperationalError

from commrl.sweep.config import HeartbeatConfig, StorageSpec
from commrl.sweep.heartbeat import HEARTBEAT_ATTR, TrialHeartbeat, reap_stale_trials, silent_trials
from commrl.sweep.storage import open_storage, retry_history

HB = HeartbeatConfig(interval=1, grace=3, max_retry=1)


def journal_study(tmp_path, name="s"):
    storage = JournalStorage(JournalFileBackend(str(tmp_path / "study.journal")))
    return optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)


def running_trial(study, stamp: float):
    trial = study.ask()
    trial.suggest_int("rank", 4, 32, log=True)
    trial.suggest_float("alpha", 0.0, 1.0)
    trial.report(0.3, 2)
    trial.set_user_attr(HEARTBEAT_ATTR, stamp)
    return trial


def test_a_stale_running_trial_is_failed_and_retried_with_the_same_params(tmp_path):
    study = journal_study(tmp_path)
    start = time.time()
    now = start + 10  # the reaper looks 10 s later; only `alive` stamped in between
    dead = running_trial(study, start)
    alive = running_trial(study, now)

    assert reap_stale_trials(study, HB, now=now) == [dead.number]
    by_number = {t.number: t for t in study.get_trials()}
    assert by_number[dead.number].state == TrialState.FAIL
    assert by_number[alive.number].state == TrialState.RUNNING
    retry = by_number[max(by_number)]
    assert retry.state == TrialState.WAITING
    assert retry.params == by_number[dead.number].params
    assert retry_history(retry) == [dead.number]
    assert retry.intermediate_values == {2: 0.3}  # the retry resumes; the pruner sees what was reported

    # a second worker reaping at the same time adds nothing
    assert reap_stale_trials(journal_study(tmp_path), HB, now=now) == []
    assert len(study.get_trials()) == 3

    # the retry, once picked up, is not stale although it inherited the old stamp
    picked = study.ask()
    assert picked.number == retry.number
    assert reap_stale_trials(study, HB) == []


def test_retries_stop_after_max_retry(tmp_path):
    study = journal_study(tmp_path)
    now = time.time() + 10
    running_trial(study, now - 10)
    assert reap_stale_trials(study, HB, now=now) == [0]
    study.ask()  # the retry runs and dies too
    reap_stale_trials(study, HB, now=now + 60)
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.FAIL, TrialState.FAIL]  # max_retry=1: no third attempt


class Killed(BaseException):
    """The reaper's process dies here."""


@pytest.mark.parametrize("killed", ["before", "after"])
def test_a_reaper_killed_at_its_fail_leaves_the_trial_with_its_retry(tmp_path, monkeypatch, killed):
    """The journal reaper queues the retry, then fails the trial: killed before or after that write, it
    never leaves a failed trial without its retry, and the next reaper queues no second one."""
    study = journal_study(tmp_path)
    now = time.time() + 10
    running_trial(study, now - 10)
    storage = study._storage
    fail = storage.set_trial_state_values

    def killed_at_the_write(*args, **kwargs):
        if killed == "after":
            fail(*args, **kwargs)
        raise Killed

    monkeypatch.setattr(storage, "set_trial_state_values", killed_at_the_write)
    with pytest.raises(Killed):
        reap_stale_trials(study, HB, now=now)
    monkeypatch.undo()
    other = journal_study(tmp_path)
    left = TrialState.FAIL if killed == "after" else TrialState.RUNNING
    assert [(t.state, retry_history(t)) for t in other.get_trials()] == [
        (left, []),
        (TrialState.WAITING, [0]),
    ]
    assert reap_stale_trials(other, HB, now=now) == ([0] if killed == "before" else [])
    assert [(t.state, retry_history(t)) for t in other.get_trials()] == [
        (TrialState.FAIL, []),
        (TrialState.WAITING, [0]),
    ]


def test_the_heartbeat_thread_keeps_stamping_and_tells_live_from_dead(tmp_path):
    """A trial killed a moment ago has a fresh stamp; watching for two intervals tells it from a live one."""
    study = journal_study(tmp_path)
    dead = running_trial(study, time.time())  # stamped just now, but nobody stamps it any more
    live = study.ask()
    with TrialHeartbeat(live, interval=0.3):
        time.sleep(0.5)
        stamp = study.get_trials()[live.number].user_attrs[HEARTBEAT_ATTR]
        assert time.time() - stamp < 0.5
        assert silent_trials(study, HeartbeatConfig(interval=1, grace=3)) == [dead.number]
    assert silent_trials(study, HeartbeatConfig(interval=1, grace=3)) == [dead.number, live.number]


def test_a_transient_storage_error_does_not_stop_the_heartbeat(tmp_path, capsys):
    """One failed stamp (an NFS hiccup) is reported and tried again: the live trial keeps its heartbeat, and
    another worker's reaper leaves it alone."""
    study = journal_study(tmp_path)
    trial = study.ask()
    stamp, calls = trial.set_user_attr, []

    def flaky(key, value):
        calls.append(key)
        if len(calls) == 2:
            raise OSError(116, "Stale file handle")
        stamp(key, value)

    trial.set_user_attr = flaky
    with TrialHeartbeat(trial, interval=0.2) as beat:
        time.sleep(2)
        assert beat._thread.is_alive()
        # a reaper looking a second later: a stamp at most an interval old (not 1.8 s) is still within grace
        assert (
            reap_stale_trials(
                journal_study(tmp_path), HeartbeatConfig(interval=1, grace=2), now=time.time() + 1
            )
            == []
        )
    assert study.get_trials()[0].state == TrialState.RUNNING
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "heartbeat of trial 0: OSError: [Errno 116] Stale file handle; trying again in 0.2 s" in err


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_failed_stamp_does_not_end_optunas_heartbeat_thread_on_a_database(tmp_path, monkeypatch, capsys):
    """On sqlite or PostgreSQL the stamps are Optuna's own heartbeat thread's, which a storage error would
    end for good (the live trial then reaped and trained twice): the storage reports the failed stamp and the
    thread's next one records the heartbeat."""
    storage = open_storage(StorageSpec.parse(f"sqlite:///{tmp_path / 'o.db'}"), HB, create_dirs=True)
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    trial = study.ask()
    stamp, calls = RDBStorage.record_heartbeat, []

    def flaky(self, trial_id):
        calls.append(trial_id)
        if len(calls) == 1:
            raise OperationalError("UPDATE trial_heartbeats", {}, Exception("server closed the connection"))
        stamp(self, trial_id)

    monkeypatch.setattr(RDBStorage, "record_heartbeat", flaky)
    beat = get_heartbeat_thread(trial._trial_id, storage)
    beat.start()
    time.sleep(1.5)  # interval 1: the failed first stamp, then a recorded one
    beat.join()
    assert len(calls) == 2 and storage._get_stale_trial_ids(study._study_id) == []
    assert "heartbeat of trial id 1: OperationalError" in capsys.readouterr().err
