"""``commrl sweep init``: the study, the enqueued defaults and the MLflow parent run are created once."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

from commrl import tracking
from commrl.cli.main import main
from commrl.errors import ConfigError
from commrl.sweep.config import SweepConfig
from commrl.sweep.storage import open_storage, study_names
from commrl.sweep.study import (
    IDENTITY_ATTR,
    PARENT_ATTR,
    SweepError,
    init_study,
    make_sampler,
    open_study,
    sampler_seed,
)
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


def test_a_store_that_does_not_answer_is_an_error_not_a_second_parent_run(env, sweep_dict, monkeypatch):
    """A locked sqlite file or a server down is not a replaced store: init fails (and is rerun) instead of
    creating a second parent run that would split the study's trials between two in the report."""
    from mlflow.exceptions import MlflowException
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    cfg = SweepConfig.from_dict(sweep_dict)
    first = init_study(cfg, "locked")["mlflow_parent_run_id"]

    def locked(self, run_id):
        raise MlflowException("(sqlite3.OperationalError) database is locked")

    with monkeypatch.context() as patched, pytest.raises(MlflowException, match="database is locked"):
        patched.setattr(SqlAlchemyStore, "get_run", locked)
        init_study(cfg, "locked")
    assert init_study(cfg, "locked")["mlflow_parent_run_id"] == first


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


@pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")  # ask/tell, not optimize
def test_a_restarted_worker_samples_new_points_and_a_fresh_one_the_same_as_before(env, sweep_dict):
    """A worker rerun with its index (a crash, a requeued job) must not replay the random stream of its
    first start: it would propose again the points it already trained. Its first start stays seeded
    ``seed + worker``, so a fresh study proposes the points it always did."""
    sweep_dict["sampler"]["n_startup_trials"] = 8  # random proposals: the stream alone decides them
    cfg = SweepConfig.from_dict(sweep_dict)
    init_study(cfg, "restart")

    def life() -> dict:
        """One start of worker 0: the defaults if still queued, then one sampled point; all complete."""
        study = open_study(cfg, "restart", 0)
        while True:
            trial = study.ask()
            point = cfg.space.suggest(trial)
            study.tell(trial, 0.5)
            if trial.user_attrs.get("source") != "default":
                return point

    first, second = life(), life()
    assert second != first
    plain = optuna.create_study(direction="maximize", sampler=make_sampler(cfg.sampler, 0))
    plain.enqueue_trial(cfg.defaults)
    plain.tell(plain.ask(), 0.5)
    assert cfg.space.suggest(plain.ask()) == first  # the first start: seed + worker, as always

    assert [sampler_seed(3, w, 0) for w in range(4)] == [3, 4, 5, 6]
    restarts = {sampler_seed(3, w, s) for w in range(4) for s in (1, 2)}
    assert len(restarts) == 8 and not restarts & set(range(64))


def test_init_records_the_settings_an_older_study_did_not(env, sweep_dict):
    """A study created before train_overrides, the pruner and the defaults were part of its identity is
    not refused for them (they cannot be compared); init records the config's, which count from then on."""
    cfg = SweepConfig.from_dict({**sweep_dict, "train_overrides": ["threads=1"]})
    init_study(cfg, "old")
    study = open_study(cfg, "old")
    new_keys = ("defaults", "pruner", "train_overrides")
    study.set_user_attr(IDENTITY_ATTR, {k: v for k, v in cfg.to_dict().items() if k not in new_keys})
    changed = SweepConfig.from_dict({**sweep_dict, "train_overrides": ["threads=2"]})
    open_study(changed, "old")  # not recorded: accepted
    init_study(changed, "old")
    assert open_study(changed, "old").user_attrs[IDENTITY_ATTR] == changed.to_dict()
    with pytest.raises(ConfigError, match=r"train_overrides: study has \['threads=2'\]"):
        open_study(cfg, "old")


def test_a_new_study_refuses_the_trial_folders_of_a_lost_one(env, sweep_dict):
    """Trial folders keyed by number would make a re-created study resume the old trials' checkpoints."""
    cfg = SweepConfig.from_dict(sweep_dict)
    (trials_dir(cfg, "lost") / "trial0000").mkdir(parents=True)
    with pytest.raises(SweepError, match="holds the trials of an earlier study named 'lost'"):
        init_study(cfg, "lost")
    assert "lost" not in study_names(open_storage(cfg.storage, cfg.heartbeat))


def test_a_changed_pair_file_refuses_to_add_trials_to_the_study(env, sweep_dict, tmp_path, monkeypatch):
    """The pair file the trials compose changed after init (the learning rate): a worker, or a rerun of init,
    refuses to add trials trained under it, naming the key; the study's own settings are unchanged."""
    import shutil

    from commrl.config_tree import REPO, TREE_ENVS

    cfg = SweepConfig.from_dict(sweep_dict)
    init_study(cfg, "changed")
    assert open_study(cfg, "changed", 0).user_attrs["trial_config"]["rl.lr"] == 1.0e-4
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    tree = tmp_path / "configs" / "train"
    pair = tree / "pair" / "tiny.yaml"
    pair.write_text(pair.read_text().replace("lr: 1.0e-4", "lr: 3.0e-4"))
    monkeypatch.setenv(TREE_ENVS["train"], str(tree))
    for attempt in (lambda: open_study(cfg, "changed", 1), lambda: init_study(cfg, "changed")):
        with pytest.raises(
            ConfigError, match=r"another config of tiny/method .*\n  rl\.lr: 0\.0001 -> 0\.0003"
        ):
            attempt()


def test_a_setting_only_another_version_has_is_warned_not_refused(env, sweep_dict, capsys):
    """A study recorded by a commrl with a since-removed ``rl.old_knob`` (a setting only one side has) takes
    new trials, naming it on stderr."""
    cfg = SweepConfig.from_dict(sweep_dict)
    init_study(cfg, "upgraded")
    study = open_study(cfg, "upgraded", 0)
    recorded = dict(study.user_attrs["trial_config"])
    recorded["rl.old_knob"] = 3
    study.set_user_attr("trial_config", recorded)
    capsys.readouterr()
    open_study(cfg, "upgraded", 1)
    err = capsys.readouterr().err
    assert "another commrl or verl version" in err and "rl.old_knob: 3 -> (not set)" in err
