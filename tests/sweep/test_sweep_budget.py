"""The budget: COMPLETE + PRUNED + RUNNING trials, counted by the workers, a trial and its retries once (a
retry of a trial inside the budget is never a surplus); a rerun does only what is left."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState
from sweep_fakes import FakeDriver

from commrl.sweep.budget import budget_used, finished, is_surplus
from commrl.sweep.config import HeartbeatConfig, StorageSpec, SweepConfig
from commrl.sweep.storage import enqueue_retry, open_storage, retry_history
from commrl.sweep.study import init_study, open_study
from commrl.sweep.worker import run_worker

ASK_WITHOUT_OPTIMIZE = pytest.mark.filterwarnings(
    "ignore:Heartbeat of storage is supposed to be used with Study.optimize"
)
HB = HeartbeatConfig(interval=1, grace=3, max_retry=2)
X = {"x": FloatDistribution(0.0, 1.0)}


def sqlite_study(tmp_path) -> optuna.Study:
    storage = open_storage(StorageSpec.parse(f"sqlite:///{tmp_path / 's.db'}"), HB, create_dirs=True)
    return optuna.create_study(study_name="s", storage=storage, direction="maximize")


def test_budget_counts_finished_and_running_but_not_failed_or_waiting():
    study = optuna.create_study(direction="maximize")
    for state, value in [(TrialState.COMPLETE, 0.5), (TrialState.PRUNED, None), (TrialState.FAIL, None)]:
        study.add_trial(optuna.create_trial(state=state, value=value))
    study.ask()  # RUNNING
    study.enqueue_trial({"x": 1.0})  # WAITING
    assert budget_used(study) == 3
    assert finished(study) == 2


def test_surplus_is_decided_by_trial_number():
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.create_trial(state=TrialState.COMPLETE, value=0.1))  # 0
    study.add_trial(optuna.create_trial(state=TrialState.FAIL))  # 1: frees its slot
    study.ask()  # 2 RUNNING
    study.ask()  # 3 RUNNING: asked at the same time as 2 by another worker
    trials = study.get_trials()
    assert not is_surplus(trials, 2, n_trials=2)
    assert is_surplus(trials, 3, n_trials=2)


@ASK_WITHOUT_OPTIMIZE
def test_a_retry_of_a_trial_inside_the_budget_is_never_a_surplus(tmp_path):
    """Optuna's RDB reaper fails a dead trial, then queues its retry: a worker asking in between starts a new
    trial. The retry, popped later, resumes a point inside the budget and runs (the budget overshoots by that
    one trial rather than losing the checkpoint); a new trial after it is a surplus."""
    study = sqlite_study(tmp_path)
    for x in (0.1, 0.2):
        study.add_trial(optuna.create_trial(params={"x": x}, distributions=X, value=x))
    dead = study.ask(X)  # 2: its worker is killed
    study._storage.set_trial_state_values(dead._trial_id, TrialState.FAIL)  # the reaper fails it ...
    fresh = study.ask(X)  # 3: another worker asks in between
    assert not is_surplus(study.get_trials(), fresh.number, n_trials=3)
    assert enqueue_retry(study, study.get_trials()[dead.number], HB)  # ... and then queues its retry
    retry = study.ask()
    trials = study.get_trials()
    assert retry.number == 4 and retry_history(trials[4]) == [dead.number]
    assert not is_surplus(trials, retry.number, n_trials=3)
    late = study.ask(X)
    assert is_surplus(study.get_trials(), late.number, n_trials=3)


@ASK_WITHOUT_OPTIMIZE
def test_a_dead_trial_and_its_running_retry_hold_one_slot(tmp_path):
    """A trial killed after its retry was queued stays RUNNING until reaped; its retry, running meanwhile,
    takes no second slot from the budget."""
    study = sqlite_study(tmp_path)
    dead = study.ask(X)  # 0: killed before Optuna's tell
    assert enqueue_retry(study, study.get_trials()[dead.number], HB)
    retry = study.ask()  # 1
    fresh = study.ask(X)  # 2
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.RUNNING] * 3 and retry_history(trials[retry.number]) == [
        0
    ]
    assert budget_used(study) == 2
    assert not is_surplus(trials, retry.number, n_trials=1)
    assert not is_surplus(trials, fresh.number, n_trials=2)
    assert is_surplus(trials, fresh.number, n_trials=1)


def test_workers_run_exactly_the_budget_and_a_rerun_does_nothing(env, sweep_dict):
    cfg = SweepConfig.from_dict({**sweep_dict, "n_trials": 3})
    init_study(cfg, "budget")
    driver = FakeDriver(cfg.ticks, cfg.val_every)
    first = run_worker(cfg, "budget", 0, driver=driver)
    assert [t["number"] for t in first["trials"]] == [0, 1, 2]
    assert first["trials"][0]["params"] == cfg.defaults  # the enqueued defaults run first
    assert first["study_complete"]

    again = run_worker(cfg, "budget", 1, driver=driver)  # MaxTrialsCallback would run a 4th trial here
    assert again["trials"] == []
    study = open_study(cfg, "budget")
    assert len(study.get_trials()) == 3 and finished(study) == 3

    more = SweepConfig.from_dict({**sweep_dict, "n_trials": 5})  # extend the study: only the new trials run
    extended = run_worker(more, "budget", 1, driver=driver)
    assert [t["number"] for t in extended["trials"]] == [3, 4]
    assert finished(open_study(more, "budget")) == 5
