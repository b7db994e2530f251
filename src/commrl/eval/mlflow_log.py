"""One MLflow run per evaluation, following ``commrl.tracking``.

The run lives in experiment ``commrl/<pair>``, nested under the training run it evaluates when that is
known (tag ``mlflow.parentRunId``, also ``training_run_id``; the training run's ``condition``, ``seed``,
``codec`` and ``driver`` tags are copied). Tags ``kind=eval``, ``benchmark``, ``checkpoint``,
``backend``; metrics ``eval/<benchmark>/<metric>`` made MLflow-safe (``pass@8`` -> ``pass_at_8``); params
flattened; the summary, the full results, the per-sample log and the generated task as artifacts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from commrl import tracking
from commrl.eval.errors import TrainingRunError

COPIED_PARENT_TAGS = ("condition", "seed", "codec", "driver")
ARTIFACT_DIR = "eval"


def training_run(run_id: str, tracking_uri: str):
    """The MLflow run ``run_id``; raises ``TrainingRunError`` naming the id and the store if it is missing."""
    from mlflow.exceptions import MlflowException

    try:
        return tracking.client(tracking_uri).get_run(run_id)
    except MlflowException as err:
        raise TrainingRunError(
            f"training run {run_id!r} is not in the MLflow store {tracking_uri}; check --run-id/--summary "
            "and MLFLOW_TRACKING_URI"
        ) from err


def metric_name(benchmark: str, metric: str) -> str:
    """``eval/<benchmark>/<metric>``, MLflow-safe."""
    return tracking.metric_key(f"eval/{benchmark}/{metric}")


def log_evaluation(
    *,
    benchmark: str,
    pair: str,
    checkpoint: str,
    backend: str,
    metrics: Mapping[str, float],
    params: Mapping[str, Any],
    summary: dict[str, Any],
    artifacts: Sequence[Path],
    tracking_uri: str,
    parent=None,
) -> str:
    """Create the evaluation run, log everything, finish it; the run id. ``summary`` gets the run id and is
    logged as ``eval/summary.json``. On an error the run is marked FAILED and the error re-raised."""
    from mlflow.entities import Metric

    c = tracking.client(tracking_uri)
    tags = {
        "kind": "eval",
        "benchmark": benchmark,
        "checkpoint": checkpoint,
        "backend": backend,
        "pair": pair,
        "git_commit": tracking.git_commit(),
    }
    if parent is not None:
        experiment_id = parent.info.experiment_id
        tags |= {"mlflow.parentRunId": parent.info.run_id, "training_run_id": parent.info.run_id}
        tags |= {k: parent.data.tags[k] for k in COPIED_PARENT_TAGS if k in parent.data.tags}
        run_name = f"{parent.info.run_name}/eval/{benchmark}"
    else:
        experiment_id = tracking.ensure_experiment(tracking.experiment_name(pair), tracking_uri, c)
        run_name = f"eval/{benchmark}"
    run = c.create_run(experiment_id, run_name=run_name, tags=tags)
    run_id = run.info.run_id
    try:
        now = int(time.time() * 1000)
        entries = [Metric(metric_name(benchmark, k), float(v), now, 0) for k, v in metrics.items()]
        c.log_batch(run_id, metrics=entries)
        tracking.log_params(run_id, params, tracking_uri)
        summary["mlflow_run_id"] = run_id
        c.log_dict(run_id, summary, f"{ARTIFACT_DIR}/summary.json")
        for path in artifacts:
            if path.is_dir():
                c.log_artifacts(run_id, str(path), f"{ARTIFACT_DIR}/{path.name}")
            else:
                c.log_artifact(run_id, str(path), ARTIFACT_DIR)
        c.set_terminated(run_id, "FINISHED")
    except BaseException:
        c.set_terminated(run_id, "FAILED")
        raise
    return run_id
