"""``commrl sweep init``: the study, the enqueued defaults and the MLflow parent run are created once."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

from commrl import tracking
from commrl.cli.main import main
from commrl.sweep.config import SweepConfig
from commrl.sweep.storage import open_storage, study_names
from commrl.sweep.study import PARENT_ATTR, SweepError, init_study, make_sampler, open_study
from commrl.sweep.trial_config import trials_dir


@pytest.mark.parametrize("backend", ["sqlite", "journal"])
def test_init_creates_the_study_once(env, tmp_path, sweep_dict, write_config, backend):
    if backend == "journal":
        sweep_dict["storage"] = str(tmp_path / "shared" / "tiny.journal")
    config = write_config(sweep_dict)
    out = tmp_path / "sweeps" / "init.json"
    assert main(["sweep", "init", "--config", str(config), "--study", "s1", "--out", str(out)]) == 0
    first = json.loads(out.read_text())
    assert first["created"] is True and first["study"] == "s1"

    assert main(["sweep", "init", "--config", str(config), "--study", "s1", "--out", str(out)]) == 0
    second = json.loads(out.read_text())
    assert second["created"] is False
    assert second["mlflow_parent_run_id"] == first["mlflow_parent_run_id"]

    study = open_study(SweepConfig.from_dict(sweep_dict), "s1")
    trials = study.get_trials()
    assert len(trials) == 1  # the defaults, enqueued once
    assert trials[0].state == TrialState.WAITING and trials[0].user_attrs == {"source": "default"}
    assert study.user_attrs[PARENT_ATTR] == first["mlflow_parent_run_id"]

    run = tracking.client().get_run(first["mlflow_parent_run_id"])
    assert run.data.tags["kind"] == "sweep" and run.data.tags["optuna.study"] == "s1"
    assert run.data.params["read_at"] == "6" and run.data.params["defaults.rank"] == "6"
    exp = tracking.client().get_experiment(run.info.experiment_id)
    assert exp.name == "commrl/tiny"


def test_init_finishes_a_half_done_set_up(env, sweep_dict):
    """A crash after creating the study but before the parent run: the next init adds only what is missing."""
    cfg = SweepConfig.from_dict(sweep_dict)
    init_study(cfg, "half")
    study = open_study(cfg, "half")
    study.set_user_attr(PARENT_ATTR, "no-such-run")  # the MLflow store was replaced since
    record = init_study(cfg, "half")
    assert record["mlflow_parent_run_id"] != "no-such-run"
    assert len(open_study(cfg, "half").get_trials()) == 1


def test_worker_needs_an_initialised_study(env, sweep_dict):
    cfg = SweepConfig.from_dict(sweep_dict)
    with pytest.raises(SweepError, match="run `commrl sweep init` first"):
        open_study(cfg, "missing")
    init_study(cfg, "present")
    with pytest.raises(SweepError, match="study 'other' is not in"):
        open_study(cfg, "other")


def test_workers_sample_with_different_seeds(sweep_dict):
    cfg = SweepConfig.from_dict(sweep_dict)

    def first_points(worker: int) -> list[dict]:
        study = optuna.create_study(direction="maximize", sampler=make_sampler(cfg.sampler, worker))
        return [cfg.space.suggest(study.ask()) for _ in range(3)]

    assert first_points(0) == first_points(0)
    assert first_points(0) != first_points(1)


def test_a_new_study_refuses_the_trial_folders_of_a_lost_one(env, sweep_dict):
    """Trial folders keyed by number would make a re-created study resume the old trials' checkpoints."""
    cfg = SweepConfig.from_dict(sweep_dict)
    (trials_dir(cfg, "lost") / "trial0000").mkdir(parents=True)
    with pytest.raises(SweepError, match="holds the trials of an earlier study named 'lost'"):
        init_study(cfg, "lost")
    assert "lost" not in study_names(open_storage(cfg.storage, cfg.heartbeat))
