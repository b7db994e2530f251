"""A grid study end to end with the real local trainer: a 2 x 2 grid (alpha x cadence) with 2 seeds and the
dense baseline, 2 ticks each, through ``commrl sweep init | worker | summary``; every point trains once as
an MLflow run carrying its point and seed, and the summary pairs each cell with dense by seed.
(Tiny data and an untrained tiny model from conftest's ``tiny_world``; HF sampler.)"""

from __future__ import annotations

import json

import pytest
from optuna.trial import TrialState

from commrl import tracking
from commrl.cli.main import main
from commrl.sweep.config import load_sweep_config
from commrl.sweep.grid import grid_studies
from commrl.sweep.study import PARENT_ATTR, open_study

pytestmark = pytest.mark.slow


def test_a_2x2_grid_with_2_seeds_and_its_dense_baseline(env, tmp_path, sweep_dict, write_config, tiny_world):
    raw = {k: v for k, v in sweep_dict.items() if k not in ("space", "defaults", "n_trials", "seed")}
    raw.update(
        ticks=2,
        val_every=1,
        read_at=2,
        sampler={"name": "grid"},
        pruner={"name": "none"},
        baseline="dense",
        grid={"alpha": [0.25, 1.0], "cadence": [1, 2], "seed": [0, 1]},
        heartbeat={"interval": 2, "grace": 30, "max_retry": 2},
        train_overrides=[
            f"model.path={tiny_world / 'model'}",
            f"data.dir={tiny_world / 'data'}",
            "data.val_limit=8",
            "sampler.backend=hf",
            "sampler.max_new_tokens=8",
            "rl.prompts_per_tick=4",
            "rl.group_size=2",
            "rl.mini_batches=1",
            "rl.micro_batch_size=8",
            "threads=1",
        ],
    )
    config = write_config(raw)
    cfg = load_sweep_config(config)
    args = ["--config", str(config), "--study", "regime"]
    assert main(["sweep", "init", *args, "--out", str(tmp_path / "init.json")]) == 0
    for worker in (0, 1):  # the second finds every point done
        assert (
            main(["sweep", "worker", *args, "--worker", str(worker), "--out", str(tmp_path / "w.json")]) == 0
        )
    assert json.loads((tmp_path / "w.json").read_text())["baseline"]["study"] == "regime-dense"

    client = tracking.client()
    values = {}
    for part, name in grid_studies(cfg, "regime"):
        study = open_study(part, name)
        trials = study.get_trials()
        assert [t.state for t in trials] == [TrialState.COMPLETE] * part.n_trials  # once each, nothing more
        assert [t.params for t in trials] == part.space.points()
        for trial in trials:
            run = client.get_run(trial.user_attrs["mlflow_run_id"])
            tags, params = run.data.tags, run.data.params
            assert (run.info.status, tags["kind"], tags["optuna.state"]) == ("FINISHED", "trial", "COMPLETE")
            assert tags["mlflow.parentRunId"] == study.user_attrs[PARENT_ATTR]
            assert (tags["condition"], tags["seed"]) == (part.condition, str(trial.params["seed"]))
            if part.condition == "method":
                assert float(params["method.alpha"]) == trial.params["alpha"]
                assert int(params["method.cadence"]) == trial.params["cadence"]
            acc = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val/acc")}
            assert acc[cfg.read_at] == trial.value
            values[(part.condition, *trial.params.values())] = trial.value
    assert len(values) == 8 + 2

    out = tmp_path / "summary"
    assert main(["sweep", "summary", *args, "--out", str(out)]) == 0
    summary = json.loads((out / "cells.json").read_text())
    assert summary["complete"] and summary["n_cells"] == 4
    assert "mismatch/logprob_corr" in summary["diagnostics"]  # logged by the trainer
    for cell in summary["cells"]:
        alpha, cadence = cell["cell"]["alpha"], cell["cell"]["cadence"]
        diffs = [values[("method", s, cadence, alpha)] - values[("dense", s)] for s in (0, 1)]
        assert cell["difference"]["n"] == 2 and cell["difference"]["paired"]
        assert cell["difference"]["estimate"] == pytest.approx(sum(diffs) / 2)
        assert cell["diagnostics"]["mismatch/logprob_corr"]["n"] == 2
    assert (out / "heatmap.png").stat().st_size > 10_000
