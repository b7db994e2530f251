"""A study's summary: best params, the trials table, parameter importances and Optuna's plots.

Files (written into a staging folder that replaces ``out`` whole, so a reader never sees half of them):
``best_params.json`` (with ``n_seeds``: every trial trains once, at ``seed``, so the objective is one run's
value; and ``best_ties``: every complete trial whose value equals the best exactly, ``best_trial`` the
lowest number among them, ``commrl.sweep.best``: with more than one, the pick says nothing of which is
better), ``trials.csv``, ``importances.json`` (fANOVA; ``null``
with the reason when there are too few complete trials), ``history.png``, ``intermediate.png``,
``parallel_coordinate.png``, ``slice.png``, ``importances.png`` (``optuna.visualization.matplotlib``: no
plotly image export needed). All of them are logged to the study's MLflow parent run, under ``summary/``.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from commrl import tracking
from commrl.run import record
from commrl.staging import staged_dir
from commrl.sweep.best import best_trial, tied_with
from commrl.sweep.budget import finished
from commrl.sweep.config import SweepConfig
from commrl.sweep.storage import retry_history
from commrl.sweep.study import PARENT_ATTR, open_study

PLOTS = ("history", "intermediate", "parallel_coordinate", "slice", "importances")


def dashboard_hint(cfg: SweepConfig) -> str:
    return (
        f"browse the study: pip install optuna-dashboard && optuna-dashboard {cfg.storage.dashboard_target}"
        "  (then open http://127.0.0.1:8080)"
    )


def trial_row(trial: FrozenTrial, names: list[str]) -> dict[str, Any]:
    """One line of trials.csv."""
    history = retry_history(trial)
    run_id = trial.user_attrs.get("mlflow_run_id")
    out_dir = trial.user_attrs.get("out_dir")
    if not run_id and out_dir:  # a killed trial never recorded it
        run_id = record.written_run_id(Path(out_dir))
    duration = trial.duration.total_seconds() if trial.duration else None
    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": trial.value,
        **{f"param_{n}": trial.params.get(n) for n in names},
        "retry_of": history[0] if history else None,
        "mlflow_run_id": run_id,
        "source": trial.user_attrs.get("source", "sampler"),
        "note": trial.user_attrs.get("note"),
        "worker": trial.user_attrs.get("worker"),
        "duration_s": None if duration is None else round(duration, 3),
        "datetime_start": trial.datetime_start.isoformat() if trial.datetime_start else None,
    }


def importances(study: optuna.Study) -> dict[str, Any]:
    """fANOVA importances of the complete trials, or ``None`` with the reason when they cannot be computed."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return {
            "evaluator": "fanova",
            "importances": None,
            "reason": f"{len(complete)} complete trial(s); importances need at least 2",
        }
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0)
            )
    except (RuntimeError, ValueError) as err:
        return {"evaluator": "fanova", "importances": None, "reason": str(err)}
    return {
        "evaluator": "fanova",
        "importances": {k: float(v) for k, v in values.items()},
        "n_complete": len(complete),
    }


def save_plots(study: optuna.Study, out: Path, with_importances: bool) -> dict[str, str]:
    """Optuna's matplotlib plots as PNG files; returns the plots skipped, with the reason."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter
    from optuna.visualization import matplotlib as vis

    skipped: dict[str, str] = {}
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    makers = {
        "history": vis.plot_optimization_history,
        "intermediate": vis.plot_intermediate_values,
        "parallel_coordinate": vis.plot_parallel_coordinate,
        "slice": vis.plot_slice,
        "importances": lambda s: vis.plot_param_importances(
            s, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0)
        ),
    }
    for name in PLOTS:
        if not complete:
            skipped[name] = "no complete trial"
            continue
        if name == "importances" and not with_importances:
            skipped[name] = "importances could not be computed"
            continue
        with warnings.catch_warnings():  # the matplotlib plots are an experimental API
            warnings.simplefilter("ignore")
            ax = makers[name](study)
            fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
            fig.set_size_inches(max(fig.get_size_inches()[0], 8), max(fig.get_size_inches()[1], 5))
            for axes in fig.axes:  # log axes (rank): major labels only, minor ones overlap
                if axes.get_xscale() == "log":
                    axes.xaxis.set_minor_formatter(NullFormatter())
            fig.savefig(out / f"{name}.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
    return skipped


def write_trials_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows)
    frame.to_csv(path, index=False)


def summarize(cfg: SweepConfig, study_name: str, out: str | Path) -> dict[str, Any]:
    """Write the summary files to ``out``, log them to the parent run; returns best_params.json's content."""
    study = open_study(cfg, study_name)
    out = Path(out)
    names = cfg.space.names
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = best_trial(complete, lambda t: t.value, lambda t: t.number)  # val/acc: maximised
    counts = {s.name: sum(1 for t in trials if t.state == s) for s in TrialState}
    best_info: dict[str, Any] = {
        "study": study_name,
        "mlflow_parent_run_id": study.user_attrs[PARENT_ATTR],
        "pair": cfg.pair,
        "condition": cfg.condition,
        "objective": f"val/acc at tick {cfg.read_at} (maximised)",
        "n_trials": cfg.n_trials,
        "finished": finished(study),
        "states": counts,
        "best_value": best.value if best else None,
        "best_params": best.params if best else None,
        "best_trial": best.number if best else None,
        "best_mlflow_run_id": trial_row(best, names)["mlflow_run_id"] if best else None,
        "best_ties": sorted([best.number, *(t.number for t in tied_with(complete, best, lambda t: t.value))])
        if best
        else [],
        "n_seeds": 1,  # a search trains every trial once, at `seed`: the objective is one run's val/acc
        "seed": cfg.seed,
        "defaults": cfg.defaults,
        "dashboard": dashboard_hint(cfg),
    }
    imp = importances(study)
    with staged_dir(out) as stage:
        (stage / "best_params.json").write_text(json.dumps(best_info, indent=2) + "\n")
        (stage / "importances.json").write_text(json.dumps(imp, indent=2) + "\n")
        write_trials_csv(stage / "trials.csv", [trial_row(t, names) for t in trials])
        skipped = save_plots(study, stage, imp["importances"] is not None)
        if skipped:
            (stage / "plots_skipped.json").write_text(json.dumps(skipped, indent=2) + "\n")
    _log_to_parent(study.user_attrs[PARENT_ATTR], out, best_info)
    return best_info


def _log_to_parent(run_id: str, out: Path, best: dict[str, Any]) -> None:
    client = tracking.client()
    client.log_artifacts(run_id, str(out), "summary")
    if best["best_value"] is not None and math.isfinite(best["best_value"]):
        client.log_metric(run_id, "sweep/best_value", float(best["best_value"]))
    for state, n in best["states"].items():
        client.set_tag(run_id, f"optuna.n_{state.lower()}", str(n))
    if best["best_params"]:
        for k, v in best["best_params"].items():
            client.set_tag(run_id, f"optuna.best.{k}", str(v))
    if best["finished"] >= best["n_trials"] and client.get_run(run_id).info.status == "RUNNING":
        client.set_terminated(run_id, "FINISHED")
