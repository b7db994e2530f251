"""The search space and the sweep config: bad values are rejected with the field named, before any trial."""

from __future__ import annotations

import copy
from pathlib import Path

import optuna
import pytest

from commrl.cli.main import main
from commrl.errors import ConfigError
from commrl.sweep.config import SweepConfig, load_sweep_config
from commrl.sweep.space import method_overrides
from commrl.sweep.study import IDENTITY_ATTR, check_identity, make_pruner, make_sampler

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "configs" / "sweep").glob("*.yaml"))


def with_change(raw: dict, path: str, value) -> dict:
    out = copy.deepcopy(raw)
    node = out
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[key]
    if value is None:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return out


BAD = [
    ("space.rank", {"type": "int", "low": 32, "high": 4, "log": True}, "space.rank: low=32 > high=4"),
    ("space.width", {"type": "int", "low": 1, "high": 2}, "space.width: unknown parameter 'width'"),
    ("space.alpha", {"type": "float", "low": 0.0, "high": 1.0, "log": True}, "log scale needs low > 0"),
    ("space.beta", {"type": "float", "low": 0.0, "high": 1.0}, "beta.high=1.0 is out of range"),
    ("space.alpha", {"type": "float", "low": 0.0, "high": 1.5}, "space.alpha.high=1.5 is out of range"),
    ("space.rank", {"type": "float", "low": 4, "high": 32}, "space.rank.type='float' is invalid"),
    ("space.cadence", {"type": "int", "low": 0, "high": 20}, "space.cadence.low=0 is out of range"),
    ("space.cadence", {"type": "int", "low": 2, "high": 20, "step": 4}, "cadence.step=4 does not divide"),
    (
        "space.cadence",
        {"type": "int", "low": 1, "high": 20},
        "space.cadence.low=1 is out of range for condition method: its anchor is on, and at K = 1",
    ),
    ("space.rank", {"type": "int", "low": 4, "high": 32, "log": True, "step": 2}, "step and log cannot"),
    ("space.rank", {"type": "int", "low": 4, "hi": 32}, "space.rank: unknown key(s) hi"),
    ("defaults.rank", 64, "defaults.rank=64 lies outside space.rank"),
    (
        "defaults.cadence",
        None,
        "defaults must set exactly the searched knobs rank, alpha, beta, cadence; missing cadence",
    ),
    ("read_at", 5, "read_at=5 is not a validation tick"),
    ("read_at", 8, "read_at=8 is after the last tick"),
    ("storage", "results/optuna/tiny.db", "storage='results/optuna/tiny.db' is neither an RDB URL"),
    ("heartbeat", {"interval": 10, "grace": 10}, "heartbeat.grace=10 is below 2 x heartbeat.interval=10"),
    ("heartbeat", {"interval": 10, "grace": 11}, "heartbeat.grace=11 is below 2 x heartbeat.interval=10"),
    ("pruner", {"name": "hyperband", "max_resource": 60}, "pruner.max_resource=60 exceeds read_at=6"),
    ("pruner", {"name": "threshold", "lower": 5}, "pruner.lower=5 is out of range: val/acc is a fraction"),
    ("pruner", {"name": "threshold", "lower": 1.0}, "give lower below 1 (0.05 for 5%)"),
    (
        "pruner",
        {"name": "median", "n_warmup_steps": 6},
        "pruner.n_warmup_steps=6 can never stop a trial: the last validation tick before read_at=6 is 4",
    ),
    ("pruner", {"name": "threshold", "lower": 0.1, "n_warmup_steps": 5}, "use n_warmup_steps <= 4"),
    (
        "pruner",
        {"name": "hyperband", "min_resource": 5, "max_resource": 6},
        "pruner.min_resource=5 can never stop a trial",
    ),
    (
        "sampler",
        {"name": "tpe", "seed": 2**32 - 1},
        "sampler.seed=4294967295 is too large for n_workers=2: worker w samples with seed + w, which must "
        "stay below 2**32; use sampler.seed <= 4294967294",
    ),
    ("pruner", {"name": "median", "n_warmup": 3}, "pruner: unknown key(s) n_warmup"),
    ("pruner", {"name": "sha"}, "pruner.name='sha' is not one of"),
    ("sampler", {"name": "tpe", "seed": -1}, "sampler.seed=-1 must be an integer >= 0"),
    ("driver", "slurm", "driver='slurm' is not one of local, verl"),
    ("objective", "val/acc", "unknown key(s) objective"),
    ("train_overrides", ["method.rank=8"], "train_overrides method.rank=8: the sweep sets these"),
    ("n_trials", 0, "n_trials=0 must be an integer >= 1"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_config_is_rejected_naming_the_field(sweep_dict, field, value, message):
    with pytest.raises(ConfigError) as err:
        SweepConfig.from_dict(with_change(sweep_dict, field, value))
    assert message in str(err.value)


def test_a_pruner_needs_a_validation_tick_before_read_at(sweep_dict):
    """The pruner is asked at the validations before read_at only: with none, it can never stop a trial."""
    raw = {**sweep_dict, "val_every": 6, "pruner": {"name": "median"}}
    with pytest.raises(ConfigError, match=r"pruner.name='median' can never stop a trial: no validation tick"):
        SweepConfig.from_dict(raw)
    assert SweepConfig.from_dict({**raw, "pruner": {"name": "none"}}).val_every == 6


def test_the_largest_sampler_seed_accepted_samples_in_every_worker(sweep_dict):
    """Worker w samples with seed + w: the largest seed the config accepts works in its last worker."""
    raw = with_change(sweep_dict, "sampler.seed", 2**32 - sweep_dict["n_workers"])
    cfg = SweepConfig.from_dict(raw)
    study = optuna.create_study(sampler=make_sampler(cfg.sampler, worker=cfg.n_workers - 1))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    assert len(study.trials) == 1


def test_the_shipped_configs_are_valid_and_enqueue_the_notes_settings():
    from commrl.rl.config import compose_train_config

    tiny = load_sweep_config(REPO / "configs/sweep/tiny.yaml")
    pair = compose_train_config(["pair=tiny"], REPO / "configs" / "train")["method"]
    assert tiny.defaults == {k: pair[k] for k in ("rank", "alpha", "beta", "cadence")}  # the tiny pair's own
    assert (tiny.ticks, tiny.read_at, tiny.driver, tiny.storage.kind) == (20, 20, "local", "rdb")
    assert tiny.space["rank"].log and tiny.space["rank"].high < 128  # below the tiny hidden size
    assert tiny.space["cadence"].low == 2  # K = 1 would be dense training
    paper = load_sweep_config(REPO / "configs/sweep/paper_A.yaml")
    assert paper.defaults == {"rank": 77, "alpha": 0.25, "beta": 0.25, "cadence": 20}
    assert (paper.driver, paper.storage.kind, paper.read_at) == ("verl", "journal", 100)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_config_loads(path):
    cfg = load_sweep_config(path)
    if not cfg.is_grid and "cadence" in cfg.space.names:
        assert cfg.space["cadence"].low >= 2


def test_a_grid_may_list_cadence_1_as_a_dense_control(sweep_dict):
    raw = {k: v for k, v in sweep_dict.items() if k not in ("space", "defaults", "n_trials", "seed")}
    raw.update(sampler={"name": "grid"}, pruner={"name": "none"}, grid={"cadence": [1, 2], "seed": [0]})
    assert SweepConfig.from_dict(raw).space.values("cadence") == (1, 2)


def first_pruned_tick(path: Path) -> int | None:
    """The first validation tick at which the config's pruner (``make_pruner``) stops a trial below every
    earlier one, asked as ``PruningHooks`` asks it (validation ticks before ``read_at``)."""
    cfg = load_sweep_config(path)
    study = optuna.create_study(direction="maximize", pruner=make_pruner(cfg.pruner))
    ticks = range(cfg.val_every, cfg.read_at, cfg.val_every)
    for _ in range(cfg.pruner.options.get("n_startup_trials", 0)):
        trial = study.ask()
        for tick in ticks:
            trial.report(1.0, tick)
        study.tell(trial, 1.0)
    trial = study.ask()
    for tick in ticks:
        trial.report(0.0, tick)
        if trial.should_prune():
            return tick
    return None


@pytest.mark.parametrize(("name", "tick"), [("paper_A.yaml", 50), ("tiny.yaml", 10)])
def test_the_pruners_first_stop_is_the_one_their_comment_names(name, tick):
    """Optuna's median pruner prunes from step ``n_warmup_steps`` on (it skips only the steps below)."""
    assert first_pruned_tick(REPO / "configs" / "sweep" / name) == tick
    assert f"may stop a trial at tick {tick} " in (REPO / "configs" / "sweep" / name).read_text()


def test_the_identity_holds_what_changes_the_trials(sweep_dict):
    """train_overrides (in any order), the pruner and the defaults change what a trial trains or means: a
    study refuses a config that changes them; n_trials, n_workers, the heartbeat and the sampler may."""
    raw = {**sweep_dict, "train_overrides": ["threads=1", "sampler.backend=hf"]}
    study = optuna.create_study()
    study.set_user_attr(IDENTITY_ATTR, SweepConfig.from_dict(raw).to_dict())
    free = {
        "train_overrides": ["sampler.backend=hf", "threads=1"],
        "n_trials": 9,
        "n_workers": 5,
        "heartbeat": {"interval": 2, "grace": 9, "max_retry": 0},
        "sampler": {"name": "random", "seed": 4},
    }
    check_identity(study, SweepConfig.from_dict({**raw, **free}))
    refused = [
        ("train_overrides", ["threads=2", "sampler.backend=hf"]),
        ("pruner", {"name": "median", "n_warmup_steps": 2}),
        ("defaults", {**raw["defaults"], "rank": 8}),
    ]
    for key, value in refused:
        with pytest.raises(ConfigError, match=f"created with other settings \\({key}: study has"):
            check_identity(study, SweepConfig.from_dict({**raw, key: value}))


def test_space_suggests_inside_its_bounds_and_keeps_enqueued_values(sweep_dict):
    cfg = SweepConfig.from_dict(sweep_dict)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
    study.enqueue_trial(cfg.defaults)
    first = cfg.space.suggest(study.ask())
    assert first == cfg.defaults
    for _ in range(20):
        point = cfg.space.suggest(study.ask())
        assert cfg.space.check_point(point, "p") == point
        assert isinstance(point["rank"], int) and isinstance(point["cadence"], int)


def test_method_overrides_per_driver():
    params = {"rank": 8, "alpha": 0.5, "beta": 0.125, "cadence": 7}
    assert method_overrides(params, "local") == [
        "method.rank=8",
        "method.alpha=0.5",
        "method.beta=0.125",
        "method.cadence=7",
    ]
    assert "method.delay=7" in method_overrides(params, "verl")  # the paper tree sets h explicitly


def test_init_rejects_a_bad_space_before_creating_anything(env, tmp_path, sweep_dict, write_config, capsys):
    bad = with_change(sweep_dict, "space.beta", {"type": "float", "low": 0.5, "high": 0.2})
    rc = main(["sweep", "init", "--config", str(write_config(bad)), "--out", str(tmp_path / "init.json")])
    assert rc == 2
    assert "space.beta: low=0.5 > high=0.2" in capsys.readouterr().err
    assert not (tmp_path / "optuna").exists() and not (tmp_path / "init.json").exists()


def test_worker_rejects_a_bad_space_before_any_trial(env, sweep_dict, write_config, capsys):
    good = write_config(sweep_dict, "good.yaml")
    assert main(["sweep", "init", "--config", str(good)]) == 0
    zero = {"type": "int", "low": 0, "high": 8, "log": True}
    bad = write_config(with_change(sweep_dict, "space.rank", zero))
    assert main(["sweep", "worker", "--config", str(bad), "--worker", "0"]) == 2
    assert "space.rank.low=0 is out of range" in capsys.readouterr().err
    storage = load_sweep_config(good).storage.location
    trials = optuna.load_study(study_name="tiny-method", storage=storage).get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.WAITING]  # only the enqueued defaults


def test_worker_index_must_be_one_of_the_configs_workers(env, sweep_dict, write_config, capsys):
    path = write_config({**sweep_dict, "n_workers": 2})
    for worker in (-1, 2):
        assert main(["sweep", "worker", "--config", str(path), "--worker", str(worker)]) == 2
        err = capsys.readouterr().err
        assert f"--worker={worker} is out of range: workers are 0 .. 1 (n_workers=2 in {path}" in err
        assert "raise n_workers" in err


def test_worker_refuses_a_space_that_differs_from_the_studys(env, sweep_dict, write_config, capsys):
    assert main(["sweep", "init", "--config", str(write_config(sweep_dict, "a.yaml"))]) == 0
    changed = with_change(sweep_dict, "space.cadence", {"type": "int", "low": 2, "high": 30})
    assert main(["sweep", "worker", "--config", str(write_config(changed, "b.yaml"))]) == 2
    err = capsys.readouterr().err
    assert "created with other settings" in err and "space" in err


def test_init_refuses_a_study_trained_under_other_train_overrides(env, sweep_dict, write_config, capsys):
    one = write_config({**sweep_dict, "train_overrides": ["threads=1"]}, "one.yaml")
    assert main(["sweep", "init", "--config", str(one)]) == 0
    two = write_config({**sweep_dict, "train_overrides": ["threads=2"]}, "two.yaml")
    assert main(["sweep", "init", "--config", str(two)]) == 2
    err = capsys.readouterr().err
    assert "train_overrides: study has ['threads=1'], config has ['threads=2']" in err
    assert "start a new study with another --study name" in err


def test_local_trials_are_composed_at_the_space_corners(env, sweep_dict, write_config, tmp_path, capsys):
    """A corner the training config rejects (rank >= the model's hidden size) fails init, not a trial."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 16}')
    raw = with_change(sweep_dict, "train_overrides", [f"model.path={model}"])
    assert main(["sweep", "init", "--config", str(write_config(raw))]) == 2
    err = capsys.readouterr().err
    assert "space (all highs)" in err and "rank" in err and "hidden_size=16" in err


@pytest.mark.parametrize("condition", ["no_projection", "method_async", "anchor_only"])
def test_a_search_of_any_anchored_condition_refuses_cadence_1(sweep_dict, condition):
    raw = copy.deepcopy(sweep_dict)
    raw["condition"] = condition
    raw["space"]["cadence"]["low"] = 1
    with pytest.raises(ConfigError, match=f"out of range for condition {condition}: its anchor is on"):
        SweepConfig.from_dict(raw)


def test_a_search_without_the_anchor_may_reach_cadence_1(sweep_dict):
    raw = copy.deepcopy(sweep_dict)
    raw["condition"] = "anchor_off"  # configs/condition/anchor_off.yaml: method.anchor false
    raw["space"]["cadence"]["low"] = 1
    assert SweepConfig.from_dict(raw).space["cadence"].low == 1
