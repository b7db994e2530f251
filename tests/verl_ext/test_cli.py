"""``commrl verl-train``: --dry-run on CPU, the no-GPU error, and the MLflow run verl logs into."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from commrl.cli.main import main
from commrl.verl_ext import config as vc

REPO = Path(__file__).resolve().parents[2]
COMMRL = Path(sys.executable).parent / "commrl"


def test_dry_run_prints_the_resolved_verl_config(tmp_path):
    """The console script prints verl's whole resolved config as YAML (and nothing else) on stdout, exit 0."""
    env = {**os.environ, "COMMRL_RESULTS": str(tmp_path / "results"), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [
            str(COMMRL),
            "verl-train",
            "--pair",
            "B",
            "--condition",
            "prf_mask",
            "--seed",
            "3",
            "--out",
            str(tmp_path / "run"),
            "--dry-run",
            "method.cadence=10",
            "trainer.save_freq=5",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["trainer"]["experiment_name"] == "B/prf_mask/seed3"
    assert cfg["trainer"]["save_freq"] == 5 and cfg["trainer"]["total_training_steps"] == 75
    assert cfg["data"]["max_response_length"] == 4096 and cfg["data"]["seed"] == 3
    assert cfg["data"]["train_files"] == str(tmp_path / "results" / "data" / "deepscaler" / "train.parquet")
    env_vars = cfg["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    method = vc.method_from_env(env_vars)
    assert (method.codec, method.cadence, method.seed) == ("prf_mask", 10, 3)
    assert env_vars["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    assert "MLFLOW_RUN_ID" not in env_vars
    assert "does not exist yet" in proc.stderr
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_without_gpu_it_says_so_and_points_at_dry_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COMMRL_RESULTS", str(tmp_path))
    rc = main(["verl-train", "--pair", "A", "--condition", "dense", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "main_ppo needs a GPU" in err and "--dry-run" in err and "tiny" in err
    assert "torch is a CPU build" in err and "--sdm conda" in err  # this machine's torch is the CPU wheel


def test_with_a_cuda_torch_and_no_gpu_it_says_the_machine_has_none():
    from commrl.cli.verl_train import no_gpu_message

    message = no_gpu_message("12.8")
    assert "this machine has no GPU it can use" in message and "CPU build" not in message


@pytest.mark.parametrize(
    ("override", "message"),
    [("trainer.no_such_key=3", "verl rejected an override"), ("method.alpha=2", "method.alpha=2 is invalid")],
)
def test_bad_overrides_exit_2_with_the_field(tmp_path, capsys, monkeypatch, override, message):
    monkeypatch.setenv("COMMRL_RESULTS", str(tmp_path))
    rc = main(
        ["verl-train", "--pair", "A", "--condition", "method", "--out", str(tmp_path), "--dry-run", override]
    )
    assert rc == 2
    assert message in capsys.readouterr().err


def test_mlflow_run_has_commrl_tags_and_receives_verls_logging(tmp_path, monkeypatch):
    """The driver opens ``A/method/seed0`` with the full tag set of the run record (the report reads verl
    runs at their ``read_at``, as local ones); verl's Tracking (MLFLOW_RUN_ID) logs into it, with method.md
    §4 names beside verl's; a second attempt reopens the same run."""
    import mlflow
    import verl.utils.tracking as verl_tracking

    from commrl import tracking
    from commrl.cli.verl_train import identity
    from commrl.run import record
    from commrl.verl_ext.trainer import logging_method_names

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = vc.compose_run("A", "method", 0, ["ticks=120"])
    run_id, resumed = record.open_run(identity(spec, spec.ticks), tmp_path / "run", uri)
    record.log_config(run_id, {"method": spec.method.to_dict()}, uri)
    assert not resumed
    run = tracking.client(uri).get_run(run_id)
    assert run.info.run_name == "A/method/seed0"
    tags = ("pair", "condition", "codec", "seed", "driver", "kind", "read_at", "ticks")
    assert {k: run.data.tags[k] for k in tags} == {
        "pair": "A",
        "condition": "method",
        "codec": "lowrank",
        "seed": "0",
        "driver": "verl",
        "kind": "train",
        "read_at": "100",
        "ticks": "120",
    }
    assert run.data.params["method.rank"] == "77"
    assert record.recorded_run_id(tmp_path / "run", uri) == run_id
    assert record.open_run(identity(spec, spec.ticks), tmp_path / "run", uri) == (run_id, True)

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    step = {
        "critic/score/mean": 0.5,
        "actor/comm/bytes_total": 3.0,
        "actor/anchor/fire": 1.0,
        "actor/codec/energy_captured": 0.8,
        "actor/sign_memory/agreement": 1.0,
        "val-core/commrl/math500/acc/mean@1": 0.25,
        "timing_s/step": 2.0,
        "actor/kl_loss": 0.01,
    }
    try:
        stock = verl_tracking.Tracking
        with logging_method_names():  # RayPPOTrainer.fit imports Tracking inside, as here
            from verl.utils.tracking import Tracking

            Tracking("commrl/A", "A/method/seed0", ["mlflow"], config={"x": 1}).log(step, step=4)
    finally:
        mlflow.end_run()
    metrics = tracking.client(uri).get_run(run_id).data.metrics
    assert (
        metrics["score/mean"] == 0.5 and metrics["comm/bytes_total"] == 3.0 and metrics["anchor/fire"] == 1.0
    )
    assert metrics["codec/energy_captured"] == 0.8 and metrics["sign_memory/agreement"] == 1.0
    assert metrics["val/acc"] == 0.25 and metrics["time/step_s"] == 2.0
    assert metrics["actor/kl_loss"] == 0.01 and metrics["critic/score/mean"] == 0.5
    assert verl_tracking.Tracking is stock  # the swap ends with the context
