"""One trial: intermediate values reach the pruner, a pruned or alarmed trial ends PRUNED in Optuna and
FINISHED in MLflow with tag optuna.state=PRUNED, a complete one returns val/acc at read_at.

The trials use ``sweep_fakes.FakeDriver`` (creating its MLflow run as the trainer does, and leaving it
RUNNING when stopped); the real trainer's runs are checked in test_sweep_e2e.py.
"""

from __future__ import annotations

import pytest
from optuna.trial import TrialState
from sweep_fakes import FakeDriver, fake_accuracy

from commrl import tracking
from commrl.sweep.config import SweepConfig
from commrl.sweep.study import PARENT_ATTR, init_study, open_study
from commrl.sweep.worker import run_worker


def runs_by_trial(study) -> dict[int, object]:
    client = tracking.client()
    parent = study.user_attrs[PARENT_ATTR]
    exp = client.get_run(parent).info.experiment_id
    children = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent}'")
    return {int(r.data.tags["optuna.trial"]): r for r in children}


def test_pruned_trials_end_finished_with_the_pruned_tag(env, sweep_dict):
    sweep_dict.update(n_trials=3, pruner={"name": "threshold", "lower": 0.9, "n_warmup_steps": 1})
    cfg = SweepConfig.from_dict(sweep_dict)
    init_study(cfg, "prune")
    record = run_worker(cfg, "prune", 0, driver=FakeDriver(cfg.ticks, cfg.val_every, with_mlflow=True))
    study = open_study(cfg, "prune")
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.PRUNED] * 3  # every val/acc < 0.9 at tick 2
    assert all(t.last_step == 2 for t in trials)
    assert record["trials"][0]["note"].startswith("pruned at tick 2")
    runs = runs_by_trial(study)
    assert sorted(runs) == [0, 1, 2]
    for number, run in runs.items():
        assert run.info.status == "FINISHED"
        assert run.data.tags["optuna.state"] == "PRUNED"
        assert run.data.tags["kind"] == "trial" and run.data.tags["optuna.study"] == "prune"
        assert float(run.data.tags["optuna.params.alpha"]) == trials[number].params["alpha"]
        assert trials[number].user_attrs["mlflow_run_id"] == run.info.run_id


def test_complete_trials_return_val_acc_at_read_at_and_report_each_validation(env, sweep_dict):
    sweep_dict.update(n_trials=2)
    cfg = SweepConfig.from_dict(sweep_dict)
    init_study(cfg, "complete")
    run_worker(cfg, "complete", 0, driver=FakeDriver(cfg.ticks, cfg.val_every, with_mlflow=True))
    study = open_study(cfg, "complete")
    first = study.get_trials()[0]
    assert first.state == TrialState.COMPLETE
    assert first.value == pytest.approx(fake_accuracy(cfg.defaults, cfg.read_at))
    assert sorted(first.intermediate_values) == [2, 4, 6]  # tick 0 (the base model) is not a trial's
    runs = runs_by_trial(study)
    assert {r.data.tags["optuna.state"] for r in runs.values()} == {"COMPLETE"}
    assert runs[0].info.run_name == "tiny/complete/trial0000"


def test_a_collapse_alarm_prunes_the_trial(env, sweep_dict):
    sweep_dict.update(n_trials=1)
    cfg = SweepConfig.from_dict(sweep_dict)
    init_study(cfg, "alarm")
    run_worker(cfg, "alarm", 0, driver=FakeDriver(cfg.ticks, cfg.val_every, with_mlflow=True, alarm_at=3))
    trial = open_study(cfg, "alarm").get_trials()[0]
    assert trial.state == TrialState.PRUNED
    assert trial.user_attrs["note"] == "collapse alarm at tick 3"
    run = tracking.client().get_run(trial.user_attrs["mlflow_run_id"])
    assert (run.info.status, run.data.tags["optuna.state"]) == ("FINISHED", "PRUNED")


def test_median_pruner_stops_a_trial_below_the_median(env, sweep_dict):
    """The defaults are the fake optimum; a far-off point falls below the median and is stopped early,
    although every trial starts from the same base-model accuracy at tick 0."""
    sweep_dict.update(
        n_trials=2,
        ticks=10,
        val_every=2,
        read_at=10,
        pruner={"name": "median", "n_startup_trials": 1, "n_warmup_steps": 2},
    )
    cfg = SweepConfig.from_dict(sweep_dict)
    study = open_study(cfg, init_study(cfg, "median")["study"])
    study.enqueue_trial({"rank": 32, "alpha": 1.0, "beta": 0.9, "cadence": 20})
    run_worker(cfg, "median", 0, driver=FakeDriver(cfg.ticks, cfg.val_every))
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED]
    assert trials[1].last_step < cfg.read_at
