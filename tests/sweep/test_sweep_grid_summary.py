"""The grid summary on a hand-built MLflow store: per cell, method and dense val/acc at read_at, the paired
difference with its t interval (checked against a hand computation), the diagnostics the runs logged (and
only those), the files, the heat map, and what is logged to the studies' parent runs."""

from __future__ import annotations

import json
import math
import statistics

import pandas as pd
import pytest
from matplotlib import image
from optuna.trial import TrialState

from commrl import tracking
from commrl.cli.main import main
from commrl.sweep.config import load_sweep_config
from commrl.sweep.grid import grid_studies
from commrl.sweep.grid_summary import DIAGNOSTICS
from commrl.sweep.study import PARENT_ATTR, init_study, open_study

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T_2 = 4.302652729911275  # Student's t, 2 degrees of freedom, 0.975 quantile
# val/acc at read_at per (alpha, prompts) -> by seed; dense per prompts -> by seed
METHOD = {
    (0.25, 4): [0.50, 0.60, 0.55],
    (1.0, 4): [0.30, 0.20, 0.25],
    (0.25, 8): [0.70, 0.65, 0.75],
    (1.0, 8): [0.10, 0.12, None],  # seed 2: pruned
}
DENSE = {4: [0.40, 0.42, 0.47], 8: [0.60, 0.62, None]}  # seed 2 at 8 prompts: not trained yet


def log_run(
    study_name: str, parent: str, trial, value: float, corr: list[float], energy: float | None
) -> str:
    """The trial's MLflow run as the trainer would leave it: val/acc per validation, some diagnostics."""
    client = tracking.client()
    exp = tracking.ensure_experiment(tracking.experiment_name("tiny"))
    tags = {"kind": "trial", "mlflow.parentRunId": parent, "optuna.study": study_name}
    run_id = client.create_run(exp, run_name=f"{study_name}/{trial.number}", tags=tags).info.run_id
    for step, acc in ((0, 0.4), (2, value / 2), (6, value)):
        client.log_metric(run_id, "val/acc", acc, step=step)
    for step, c in enumerate(corr, start=1):
        client.log_metric(run_id, "mismatch/logprob_corr", c, step=step)
    client.log_metric(run_id, "mismatch/logprob_corr", 99.0, step=7)  # after read_at: left out
    if energy is not None:
        client.log_metric(run_id, "codec/energy_captured", energy, step=3)
    client.log_metric(run_id, "health/alarm", float(value < 0.15), step=4)
    client.set_terminated(run_id, "FINISHED")
    return run_id


def build_studies(cfg) -> dict[str, str]:
    """Both studies initialised, their queued points finished by hand with MLflow runs; returns parents."""
    parents = {}
    for part, name in grid_studies(cfg, "regime"):
        init_study(part, name)
        study = open_study(part, name)
        parents[name] = study.user_attrs[PARENT_ATTR]
        for _ in range(part.n_trials):
            trial = study.ask()
            point = part.space.suggest(trial)
            seed = point["seed"]
            if part.condition == "dense":
                value = DENSE[point["prompts_per_tick"]][seed]
            else:
                value = METHOD[(point["alpha"], point["prompts_per_tick"])][seed]
            if value is None and part.condition == "dense":
                continue  # left RUNNING: not finished
            if value is None:
                study.tell(trial, state=TrialState.PRUNED)
                continue
            energy = 0.8 + 0.01 * seed if point.get("alpha") == 0.25 else None
            corr = [0.2 + 0.1 * seed, 0.4 + 0.1 * seed] if part.condition == "method" else [1.0, 1.0]
            run_id = log_run(name, parents[name], trial, value, corr, energy)
            trial.set_user_attr("mlflow_run_id", run_id)
            study.tell(trial, value)
    return parents


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_cells_pair_method_and_dense_by_seed_with_a_t_interval(
    env, tmp_path, sweep_dict, write_config, capsys
):
    raw = {k: v for k, v in sweep_dict.items() if k not in ("space", "defaults", "n_trials", "seed")}
    raw.update(
        sampler={"name": "grid"},
        pruner={"name": "none"},
        baseline="dense",
        grid={"alpha": [0.25, 1.0], "cadence": [2], "prompts_per_tick": [4, 8], "seed": [0, 1, 2]},
    )
    config = write_config(raw)
    cfg = load_sweep_config(config)
    parents = build_studies(cfg)
    out = tmp_path / "summary"
    assert main(["sweep", "summary", "--config", str(config), "--study", "regime", "--out", str(out)]) == 0
    assert "points finished regime-dense 5/6, regime 12/12; 4 cells" in capsys.readouterr().out

    summary = json.loads((out / "cells.json").read_text())
    assert (summary["complete"], summary["n_cells"], summary["baseline_study"]) == (False, 4, "regime-dense")
    assert summary["diagnostics"] == ["codec/energy_captured", "mismatch/logprob_corr"]  # what was logged
    cells = {(c["cell"]["alpha"], c["cell"]["prompts_per_tick"]): c for c in summary["cells"]}
    assert list(cells) == [(0.25, 4), (1.0, 4), (0.25, 8), (1.0, 8)]  # grid order

    first = cells[(0.25, 4)]
    diffs = [m - d for m, d in zip(METHOD[(0.25, 4)], DENSE[4], strict=True)]  # 0.10, 0.18, 0.08
    half = T_2 * statistics.stdev(diffs) / math.sqrt(3)
    diff = first["difference"]
    assert diff["estimate"] == pytest.approx(0.12) == pytest.approx(statistics.mean(diffs))
    assert (diff["low"], diff["high"]) == (pytest.approx(0.12 - half), pytest.approx(0.12 + half))
    assert diff["half_width"] == pytest.approx(half) and (diff["n"], diff["method"], diff["paired"]) == (
        3,
        "t",
        True,
    )
    assert first["method"]["estimate"] == pytest.approx(0.55) and first["baseline"][
        "estimate"
    ] == pytest.approx(statistics.mean(DENSE[4]))
    assert first["diagnostics"]["mismatch/logprob_corr"] == {"mean": pytest.approx(0.4), "n": 3}
    assert first["diagnostics"]["codec/energy_captured"] == {"mean": pytest.approx(0.81), "n": 3}
    assert first["seeds"] == [0, 1, 2] and (first["pruned"], first["alarms"]) == (0, 0)

    # at 8 prompts dense has seeds 0, 1: the pairs drop seed 2
    wide = cells[(0.25, 8)]
    assert (wide["method"]["n"], wide["baseline"]["n"], wide["difference"]["n"]) == (3, 2, 2)
    assert wide["difference"]["estimate"] == pytest.approx(statistics.mean([0.70 - 0.60, 0.65 - 0.62]))
    pruned = cells[(1.0, 8)]
    assert (pruned["method"]["n"], pruned["pruned"], pruned["alarms"]) == (2, 1, 2)
    assert "codec/energy_captured" not in pruned["diagnostics"]

    table = pd.read_csv(out / "cells.csv")
    assert len(table) == 4
    assert table.loc[0, "difference_half_width"] == pytest.approx(half)
    assert {"alpha", "cadence", "prompts_per_tick", "baseline_estimate", *summary["diagnostics"]} <= set(
        table
    )
    assert not set(DIAGNOSTICS[:2]) & set(table)  # the anchor cosines: no run logged them
    runs = pd.read_csv(out / "runs.csv")
    assert (len(runs), (runs["state"] == "PRUNED").sum()) == (12 + 5, 1)

    png = out / "heatmap.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    height, width = image.imread(png).shape[:2]
    assert height > 300 and width > 300

    client = tracking.client()
    main_parent, dense_parent = client.get_run(parents["regime"]), client.get_run(parents["regime-dense"])
    assert "summary/heatmap.png" in {a.path for a in client.list_artifacts(parents["regime"], "summary")}
    assert (main_parent.info.status, main_parent.data.tags["grid.finished"]) == ("FINISHED", "12/12")
    assert (dense_parent.info.status, dense_parent.data.tags["grid.finished"]) == ("RUNNING", "5/6")
