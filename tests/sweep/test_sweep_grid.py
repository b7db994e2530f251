"""Grid studies with the fast stand-in driver: every point once (and the baseline at every prompts x seed),
the budget is the grid's size, the seed and prompts axes reach the training run's overrides, a killed trial
retries its point (also when its retry is popped before its tell), a point held twice trains once, a grid
may grow in place, and a bad grid is rejected naming the field before any trial. (The real trainer:
test_sweep_grid_e2e.py.)"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import sweep_fakes
from optuna.trial import TrialState
from sweep_fakes import FakeDriver

from commrl.errors import ConfigError
from commrl.rl.config import load_train_config
from commrl.run.hooks import TrainCallbacks
from commrl.sweep.config import SweepConfig, load_sweep_config
from commrl.sweep.grid import PointTaken, claim_point, grid_studies, point_of
from commrl.sweep.grid_summary import summarize_grid
from commrl.sweep.objective import SweepObjective
from commrl.sweep.storage import enqueue_retry, retry_history
from commrl.sweep.study import PARENT_ATTR, init_study, open_study
from commrl.sweep.trial_config import check_trials, local_overrides, trials_dir, verl_command
from commrl.sweep.worker import run_worker

REPO = Path(__file__).resolve().parents[2]
GRID = {"alpha": [0.25, 1.0], "cadence": [2, 5], "prompts_per_tick": [4, 8], "seed": [0, 1]}


def grid_accuracy(params: dict, step: int) -> float:
    """A deterministic val/acc per point and tick (the baseline's points have no knobs)."""
    if step == 0:
        return 0.5
    knobs = params.get("alpha", 0.5) + params.get("cadence", 0) / 10
    run = 0.01 * params.get("seed", 0) + 0.001 * params.get("prompts_per_tick", 0)
    return round(0.1 * knobs + run + step / 1000, 6)


@pytest.fixture
def grid_dict(sweep_dict) -> dict:
    raw = {k: v for k, v in sweep_dict.items() if k not in ("space", "defaults", "n_trials", "seed")}
    raw.update(sampler={"name": "grid"}, pruner={"name": "none"}, baseline="dense", grid=copy.deepcopy(GRID))
    return raw


@pytest.fixture
def fake_grid_accuracy(monkeypatch):
    monkeypatch.setattr(sweep_fakes, "fake_accuracy", grid_accuracy)


class Recording(FakeDriver):
    """The fake driver that also composes the trial's real training config, as ``LocalDriver`` does."""

    def __init__(self, cfg: SweepConfig, **kwargs):
        super().__init__(cfg.ticks, cfg.val_every, **kwargs)
        self.cfg = cfg
        self.trained: list[tuple[dict, object]] = []

    def __call__(self, plan, hooks):
        train_cfg = load_train_config(local_overrides(self.cfg, plan.params, plan.out_dir))
        self.trained.append((dict(plan.params), train_cfg))
        return super().__call__(plan, hooks)


def run_all(cfg: SweepConfig, name: str, worker: int = 0, **kwargs) -> dict[str, Recording]:
    drivers = {}
    for part, study in grid_studies(cfg, name):
        drivers[study] = Recording(part, **kwargs)
        run_worker(part, study, worker, driver=drivers[study])
    return drivers


def finished_points(cfg: SweepConfig, name: str) -> list[dict]:
    trials = open_study(cfg, name).get_trials()
    return [t.params for t in trials if t.state == TrialState.COMPLETE]


def test_every_point_once_with_the_baseline_at_every_prompts_and_seed(
    env, tmp_path, grid_dict, fake_grid_accuracy
):
    cfg = SweepConfig.from_dict(grid_dict)
    assert cfg.n_trials == 16 and cfg.defaults == {}
    (baseline, bname), (main_cfg, name) = grid_studies(cfg, "grid")
    assert (bname, baseline.condition, baseline.n_trials) == ("grid-dense", "dense", 4)
    assert baseline.space.to_dict() == {"seed": [0, 1], "prompts_per_tick": [4, 8]}
    for part, study in grid_studies(cfg, "grid"):
        init_study(part, study)
        init_study(part, study)  # idempotent: nothing enqueued twice
    assert len(open_study(cfg, "grid").get_trials()) == 16

    drivers = run_all(cfg, "grid", worker=0, with_mlflow=True)
    run_all(cfg, "grid", worker=1)  # a second worker finds the budget used and trains nothing

    for part, study in ((baseline, bname), (main_cfg, name)):
        trials = open_study(part, study).get_trials()
        assert len(trials) == part.n_trials  # no surplus, no duplicate
        assert all(t.state == TrialState.COMPLETE for t in trials)
        points = [t.params for t in trials]
        assert points == part.space.points()  # each point once, seed-major
        assert [t.value for t in trials] == [grid_accuracy(p, part.read_at) for p in points]
        trained = drivers[study].trained
        assert [p for p, _ in trained] == points
        for params, train_cfg in trained:  # the axes reach the run's config
            assert train_cfg.seed == params["seed"]
            assert train_cfg.rl.prompts_per_tick == params["prompts_per_tick"]
            assert train_cfg.condition == part.condition
            if "alpha" in params:
                assert train_cfg.method["alpha"] == params["alpha"]
                assert train_cfg.method["cadence"] == params["cadence"]
    assert [p for p, _ in drivers[name].trained][:4] == [
        {"seed": 0, "prompts_per_tick": 4, "cadence": c, "alpha": a} for c in (2, 5) for a in (0.25, 1.0)
    ]

    header = summarize_grid(cfg, "grid", tmp_path / "summary")  # the fake runs' val/acc, from MLflow
    assert header["complete"] and header["n_cells"] == 8
    cells = json.loads((tmp_path / "summary" / "cells.json").read_text())["cells"]
    for cell in cells:  # the fake method - dense is the same in every seed: 0.1 (alpha + cadence/10 - 0.5)
        knobs = cell["cell"]["alpha"] + cell["cell"]["cadence"] / 10
        assert cell["difference"]["estimate"] == pytest.approx(0.1 * (knobs - 0.5))
        assert cell["difference"]["n"] == 2 and cell["difference"]["half_width"] == pytest.approx(0, abs=1e-9)


def test_a_grid_trial_carries_its_seed_and_prompts_to_both_drivers(grid_dict):
    cfg = SweepConfig.from_dict({**grid_dict, "grid": {**GRID, "rank": [4, 8]}})
    point = {"seed": 1, "prompts_per_tick": 8, "rank": 8, "cadence": 5, "alpha": 0.25}
    local = local_overrides(cfg, point, "/tmp/out")
    assert "seed=1" in local and "rl.prompts_per_tick=8" in local
    assert {"method.rank=8", "method.cadence=5", "method.alpha=0.25"} <= set(local)
    assert not any(o.startswith("method.seed") or o.startswith("method.prompts") for o in local)
    verl = verl_command(cfg, point, "/tmp/out")
    assert verl[verl.index("--seed") + 1] == "1"
    assert {
        "verl.data.train_batch_size=8",
        "verl.actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "method.delay=5",
    } <= set(verl)


def test_a_killed_trial_retries_its_point_and_finished_points_never_rerun(env, grid_dict, fake_grid_accuracy):
    grid_dict.update(baseline=None, grid={"alpha": [0.25, 1.0], "seed": [0, 1]})
    cfg = SweepConfig.from_dict(grid_dict)
    init_study(cfg, "kill")

    def interrupted(plan, hooks):  # Ctrl-C in the third point's trial: Optuna fails it, a retry is queued
        class Hooks(TrainCallbacks):
            def on_tick(self, step, metrics):
                if plan.number == 2 and step == 3:
                    raise KeyboardInterrupt
                hooks.on_tick(step, metrics)

            def on_validation(self, step, accuracy):
                hooks.on_validation(step, accuracy)

        return FakeDriver(cfg.ticks, cfg.val_every)(plan, Hooks())

    with pytest.raises(KeyboardInterrupt):
        run_worker(cfg, "kill", 0, driver=interrupted)
    study = open_study(cfg, "kill")
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.COMPLETE] * 2 + [TrialState.FAIL, TrialState.WAITING, TrialState.WAITING]
    run_worker(cfg, "kill", 0, driver=FakeDriver(cfg.ticks, cfg.val_every))
    trials = study.get_trials()
    killed, retry = trials[2], next(t for t in trials if retry_history(t)[:1] == [2])
    assert retry.state == TrialState.COMPLETE and retry.params == point_of(killed) == cfg.space.points()[2]
    complete = [t.params for t in trials if t.state == TrialState.COMPLETE]
    assert sorted(complete, key=str) == sorted(cfg.space.points(), key=str)  # each point once
    starts = (trials_dir(cfg, "kill") / "trial0002" / "starts.txt").read_text().split()
    assert starts[0::3] == ["0", "3"]  # the retry resumed the killed trial's folder at tick 3
    run_worker(cfg, "kill", 1, driver=FakeDriver(cfg.ticks, cfg.val_every))  # a rerun: nothing left
    assert len(study.get_trials()) == len(trials)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_only_the_first_holder_of_a_point_trains(env, grid_dict):
    """Two workers refilling the queue at once can enqueue a point twice: the later trial yields. A trial
    Optuna creates itself (the queue ran dry) refills the queue with the lost points and yields too."""
    grid_dict.update(baseline=None, grid={"alpha": [0.25, 1.0]})
    cfg = SweepConfig.from_dict(grid_dict)
    init_study(cfg, "twice")
    study = open_study(cfg, "twice")
    study.enqueue_trial({"alpha": 0.25})  # trial 2: a second holder of trial 0's point
    live, other, dup = study.ask(), study.ask(), study.ask()  # popped in number order
    trials = study.get_trials(deepcopy=False)
    claim_point(other, trials[1], trials, cfg.space)  # the first holder of its point: trains
    with pytest.raises(PointTaken, match=r"grid point \{'alpha': 0.25\} is held by trial 0 \(RUNNING\)"):
        claim_point(dup, trials[2], trials, cfg.space)
    assert dup.number == 2 and live.number == 0
    study.tell(other, state=TrialState.FAIL)  # its point is lost (e.g. retries used up)
    fresh = study.ask()
    trials = study.get_trials(deepcopy=False)
    with pytest.raises(PointTaken, match="not a queued grid point; 1 missing point"):
        claim_point(fresh, trials[3], trials, cfg.space)
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [point_of(t) for t in waiting] == [{"alpha": 1.0}]


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_retry_popped_before_its_predecessors_tell_trains_the_point(env, grid_dict, fake_grid_accuracy):
    """The preempt path queues the retry while its trial is RUNNING (Optuna fails it in its tell, after); a
    worker popping the retry first trains the point: the RUNNING trial it retries holds neither the point
    nor a second budget slot."""
    grid_dict.update(baseline=None, grid={"alpha": [0.25, 1.0]})
    cfg = SweepConfig.from_dict(grid_dict)
    init_study(cfg, "gap")
    study = open_study(cfg, "gap")
    preempted, _ = study.ask(), study.ask()  # trials 0 and 1: both points taken by two workers
    assert enqueue_retry(study, study.get_trials()[preempted.number], cfg.heartbeat)
    retry = study.ask()  # trial 2, popped by a third worker before trial 0's tell
    trials = study.get_trials()
    assert point_of(trials[2]) == point_of(trials[0]) and retry_history(trials[2]) == [0]
    run = SweepObjective(cfg, "gap", study.user_attrs[PARENT_ATTR], FakeDriver(cfg.ticks, cfg.val_every))
    study.tell(retry, run(retry))
    study.tell(preempted, state=TrialState.FAIL)
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL, TrialState.RUNNING, TrialState.COMPLETE]
    assert study.get_trials()[2].params == cfg.space.points()[0]


def test_a_grid_grows_in_place_and_only_new_points_train(env, tmp_path, grid_dict, fake_grid_accuracy):
    grid_dict.update(baseline=None, grid={"alpha": [0.25, 1.0], "seed": [0]})
    cfg = SweepConfig.from_dict(grid_dict)
    init_study(cfg, "grow")
    run_worker(cfg, "grow", 0, driver=FakeDriver(cfg.ticks, cfg.val_every))
    grown = SweepConfig.from_dict({**grid_dict, "grid": {"alpha": [0.25, 0.5, 1.0], "seed": [0, 1]}})
    init_study(grown, "grow")
    driver = Recording(grown, with_mlflow=True)
    run_worker(grown, "grow", 0, driver=driver)
    assert len(driver.trained) == 4  # 6 points, 2 finished before
    assert sorted(finished_points(grown, "grow"), key=str) == sorted(grown.space.points(), key=str)
    summarize_grid(grown, "grow", tmp_path / "summary")  # no baseline: cells of the method alone
    cells = json.loads((tmp_path / "summary" / "cells.json").read_text())["cells"]
    assert [(c["cell"], c["difference"]) for c in cells] == [({"alpha": a}, None) for a in (0.25, 0.5, 1.0)]
    assert [c["method"]["n"] for c in cells] == [1, 2, 1]  # seed 0 of 0.25 and 1.0 trained without MLflow
    shrunk = SweepConfig.from_dict({**grid_dict, "grid": {"alpha": [0.25], "seed": [0, 1]}})
    with pytest.raises(ConfigError, match="was created with other settings"):
        open_study(shrunk, "grow")
    # a value below an axis's first: the study still compares its trial config at the point it kept
    lower = SweepConfig.from_dict({**grid_dict, "grid": {"alpha": [0.1, 0.25, 0.5, 1.0], "seed": [0, 1]}})
    init_study(lower, "grow")
    driver = Recording(lower, with_mlflow=True)
    run_worker(lower, "grow", 0, driver=driver)
    assert len(driver.trained) == 2 and sorted(finished_points(lower, "grow"), key=str) == sorted(
        lower.space.points(), key=str
    )


BAD_GRIDS = [
    ({"grid": {**GRID, "width": [1, 2]}}, "grid: unknown axis 'width'"),
    ({"grid": {**GRID, "cadence": []}}, "grid.cadence is an empty list"),
    (
        {"grid": {**GRID, "alpha": [0.25, 1.5]}},
        "grid.alpha[1]=1.5 is out of range: alpha must be >= 0 and <= 1",
    ),
    ({"grid": {**GRID, "beta": [0.5, 1.0]}}, "grid.beta[1]=1.0 is out of range: beta must be >= 0 and < 1"),
    ({"grid": {**GRID, "rank": [0, 4]}}, "grid.rank[0]=0 is out of range: rank must be >= 1"),
    ({"grid": {**GRID, "seed": [-1]}}, "grid.seed[0]=-1 is out of range: seed must be >= 0"),
    (
        {"grid": {**GRID, "prompts_per_tick": [16.5]}},
        "grid.prompts_per_tick[0]=16.5 must be a finite integer",
    ),
    ({"grid": {**GRID, "cadence": [2, 2]}}, "grid.cadence repeats 2"),
    ({"grid": {**GRID, "alpha": 0.25}}, "grid.alpha=0.25 must be a list of values"),
    ({"grid": {}}, "grid must be a non-empty mapping"),
    ({"n_trials": 4}, "n_trials=4 is not the grid's size (16 points)"),
    ({"space": {"rank": {"type": "int", "low": 4, "high": 8}}}, "space: a grid study"),
    ({"seed": 0}, "seed=0 and grid.seed both set the training seed"),
    ({"pruner": {"name": "median"}}, "pruner.name='median': a grid study reads every point"),
    ({"sampler": {"name": "grid", "seed": 3}}, "sampler: seed: the grid sampler takes no options"),
    ({"sampler": {"name": "tpe"}}, "missing key(s) n_trials, space, defaults"),
    ({"baseline": "method"}, "baseline='method' is the study's own condition"),
    (
        {"train_overrides": ["rl.prompts_per_tick=32"]},
        "train_overrides rl.prompts_per_tick=32: the sweep sets",
    ),
]


@pytest.mark.parametrize(("change", "message"), BAD_GRIDS, ids=[m.split(":")[0][:40] for _, m in BAD_GRIDS])
def test_a_bad_grid_is_rejected_naming_the_field(grid_dict, change, message):
    with pytest.raises(ConfigError) as err:
        SweepConfig.from_dict({**grid_dict, **change})
    assert message in str(err.value)


def test_a_search_config_cannot_have_a_grid(sweep_dict):
    with pytest.raises(ConfigError, match=r"grid: only a grid study has these; set sampler"):
        SweepConfig.from_dict({**sweep_dict, "grid": GRID})


def test_the_shipped_regime_config_is_the_issues_grid_and_composes():
    cfg = load_sweep_config(REPO / "configs/sweep/tiny-regime.yaml")
    assert cfg.space.to_dict() == {
        "seed": [0, 1, 2],
        "prompts_per_tick": [16, 64],
        "rank": [4, 6, 8],
        "cadence": [2, 5, 10, 20],
        "alpha": [0.25, 0.5, 0.75, 1.0],
    }
    assert (cfg.ticks, cfg.val_every, cfg.read_at, cfg.driver) == (40, 10, 40, "local")
    baseline = cfg.baseline_config()
    assert (cfg.n_trials, baseline.condition, baseline.n_trials) == (288, "dense", 6)
    for part in (cfg, baseline):  # every value of every axis is a valid training run
        check_trials(part)
