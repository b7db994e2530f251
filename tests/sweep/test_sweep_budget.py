"""The budget: COMPLETE + PRUNED + RUNNING trials, counted by the workers; a rerun does only what is left."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState
from sweep_fakes import FakeDriver

from commrl.sweep.budget import budget_used, finished, is_surplus
from commrl.sweep.config import SweepConfig
from commrl.sweep.study import init_study, open_study
from commrl.sweep.worker import run_worker


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
