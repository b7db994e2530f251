"""Stale trials on a journal file (no heartbeat in Optuna 5): the DIY stamp + reaper fail and retry them."""

from __future__ import annotations

import time

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from commrl.sweep.config import HeartbeatConfig
from commrl.sweep.heartbeat import HEARTBEAT_ATTR, TrialHeartbeat, reap_stale_trials, silent_trials
from commrl.sweep.storage import retry_history

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
