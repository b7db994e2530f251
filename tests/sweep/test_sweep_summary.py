"""``commrl sweep summary``: best_params.json, trials.csv, importances.json and valid PNG plots, all logged
to the study's MLflow parent run; too few trials degrade gracefully."""

from __future__ import annotations

import json

import pandas as pd
from matplotlib import image
from sweep_fakes import FakeDriver

from commrl import tracking
from commrl.cli.main import main
from commrl.sweep.config import load_sweep_config
from commrl.sweep.study import open_study
from commrl.sweep.summary import PLOTS
from commrl.sweep.worker import run_worker

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_summary_writes_every_file_and_logs_them(env, tmp_path, sweep_dict, write_config, capsys):
    sweep_dict.update(n_trials=6, pruner={"name": "median", "n_startup_trials": 2, "n_warmup_steps": 1})
    config = write_config(sweep_dict)
    cfg = load_sweep_config(config)
    assert main(["sweep", "init", "--config", str(config), "--study", "sum"]) == 0
    run_worker(cfg, "sum", 0, driver=FakeDriver(cfg.ticks, cfg.val_every, with_mlflow=True))
    out = tmp_path / "sweeps" / "summary"
    out.mkdir(parents=True)
    (out / "stale.txt").write_text("from an earlier summary")  # replaced as a whole

    assert main(["sweep", "summary", "--config", str(config), "--study", "sum", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "optuna-dashboard sqlite:///" in printed

    names = {p.name for p in out.iterdir()}
    assert {"best_params.json", "trials.csv", "importances.json"} <= names
    assert not (out / "stale.txt").exists()
    for plot in PLOTS:
        png = out / f"{plot}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC
        height, width = image.imread(png).shape[:2]
        assert height > 100 and width > 100

    study = open_study(cfg, "sum")
    best = json.loads((out / "best_params.json").read_text())
    assert best["best_value"] == study.best_value and best["best_params"] == study.best_params
    assert best["best_params"] == cfg.defaults  # the fake accuracy peaks at the defaults
    assert best["mlflow_parent_run_id"] == study.user_attrs["mlflow_parent_run_id"]  # what the report selects
    trials = pd.read_csv(out / "trials.csv")
    assert list(trials["number"]) == list(range(6))
    assert {
        "state",
        "value",
        "param_rank",
        "param_alpha",
        "param_beta",
        "param_cadence",
        "retry_of",
        "mlflow_run_id",
    } <= set(trials.columns)
    assert trials["mlflow_run_id"].notna().all()
    imp = json.loads((out / "importances.json").read_text())
    assert set(imp["importances"]) == {"rank", "alpha", "beta", "cadence"}
    assert abs(sum(imp["importances"].values()) - 1.0) < 1e-6

    parent = study.user_attrs["mlflow_parent_run_id"]
    client = tracking.client()
    logged = {f.path for f in client.list_artifacts(parent, "summary")}
    assert {"summary/best_params.json", "summary/trials.csv", "summary/history.png"} <= logged
    run = client.get_run(parent)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["sweep/best_value"] == best["best_value"]


def test_summary_names_the_trials_tied_at_the_best_value(env, tmp_path, sweep_dict, write_config, capsys):
    """Every trial of a search trains one seed: best_params.json says so, and lists the trials whose
    val/acc equals the best exactly (here the defaults, trained twice), among which the pick is arbitrary."""
    sweep_dict.update(n_trials=3)
    config = write_config(sweep_dict)
    cfg = load_sweep_config(config)
    assert main(["sweep", "init", "--config", str(config), "--study", "ties"]) == 0
    open_study(cfg, "ties").enqueue_trial(cfg.defaults)  # the same point again: the same value
    run_worker(cfg, "ties", 0, driver=FakeDriver(cfg.ticks, cfg.val_every))
    out = tmp_path / "ties"
    assert main(["sweep", "summary", "--config", str(config), "--study", "ties", "--out", str(out)]) == 0
    best = json.loads((out / "best_params.json").read_text())
    assert (best["best_trial"], best["best_ties"], best["n_seeds"], best["seed"]) == (0, [0, 1], 1, 0)
    assert "trials [0, 1] tie at that value (one seed each)" in capsys.readouterr().out


def test_summary_with_a_single_trial_explains_what_is_missing(env, tmp_path, sweep_dict, write_config):
    sweep_dict.update(n_trials=1)
    config = write_config(sweep_dict)
    cfg = load_sweep_config(config)
    assert main(["sweep", "init", "--config", str(config), "--study", "one"]) == 0
    run_worker(cfg, "one", 0, driver=FakeDriver(cfg.ticks, cfg.val_every))
    out = tmp_path / "one"
    assert main(["sweep", "summary", "--config", str(config), "--study", "one", "--out", str(out)]) == 0
    imp = json.loads((out / "importances.json").read_text())
    assert imp["importances"] is None and "at least 2" in imp["reason"]
    skipped = json.loads((out / "plots_skipped.json").read_text())
    assert list(skipped) == ["importances"]
    assert (out / "history.png").read_bytes()[:8] == PNG_MAGIC


def test_summary_of_a_study_without_trials(env, tmp_path, sweep_dict, write_config, capsys):
    config = write_config(sweep_dict)
    assert main(["sweep", "init", "--config", str(config), "--study", "empty"]) == 0
    out = tmp_path / "empty"
    assert main(["sweep", "summary", "--config", str(config), "--study", "empty", "--out", str(out)]) == 0
    assert "no complete trial yet" in capsys.readouterr().out
    best = json.loads((out / "best_params.json").read_text())
    assert best["best_params"] is None and best["states"]["WAITING"] == 1 and best["best_ties"] == []
    assert pd.read_csv(out / "trials.csv")["state"].tolist() == ["WAITING"]
