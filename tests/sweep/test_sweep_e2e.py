"""The tiny sweep end to end with the real local trainer: two ``commrl sweep worker`` processes, one killed
with SIGKILL after its trial's first checkpoint and rerun; the retry resumes that trial's checkpoints and
MLflow run, and the study ends with exactly the asked trials. A second study checks that a trial pruned
by the real trainer ends FINISHED in MLflow with tag optuna.state=PRUNED. (Tiny data and an untrained tiny
model built here; HF sampler; a few ticks.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from commrl import tracking
from commrl.cli.main import main
from commrl.sweep.config import load_sweep_config
from commrl.sweep.storage import retry_history
from commrl.sweep.study import open_study
from commrl.sweep.worker import run_worker

pytestmark = pytest.mark.slow


def tiny_sweep(sweep_dict, tiny_world, **changes) -> dict:
    sweep_dict.update(
        n_trials=3,
        n_workers=2,
        ticks=6,
        val_every=2,
        read_at=6,
        heartbeat={"interval": 2, "grace": 8, "max_retry": 2},
    )
    sweep_dict["train_overrides"] = [
        f"model.path={tiny_world / 'model'}",
        f"data.dir={tiny_world / 'data'}",
        "sampler.backend=hf",
        "sampler.max_new_tokens=8",
        "rl.prompts_per_tick=4",
        "rl.group_size=2",
        "rl.mini_batches=1",
        "rl.micro_batch_size=8",
        "checkpoint.every=1",
        "threads=1",
    ]
    sweep_dict.update(changes)
    return sweep_dict


def has_checkpoint(out_dir: str | None) -> bool:
    folder = Path(out_dir or "/nonexistent") / "checkpoints"
    return folder.is_dir() and any(folder.iterdir())


def worker(config, index: int, out, env) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "commrl.cli.main",
        "sweep",
        "worker",
        "--config",
        str(config),
        "--study",
        "e2e",
        "--worker",
        str(index),
        "--out",
        str(out),
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_workers_a_kill_and_a_rerun(env, tmp_path, sweep_dict, write_config, tiny_world):
    config = write_config(tiny_sweep(sweep_dict, tiny_world))
    cfg = load_sweep_config(config)
    assert main(["sweep", "init", "--config", str(config), "--study", "e2e"]) == 0
    study = open_study(cfg, "e2e")
    a = worker(config, 0, tmp_path / "w0.json", env)
    b = worker(config, 1, tmp_path / "w1.json", env)

    victim = None
    deadline = time.time() + 600
    while victim is None and time.time() < deadline and b.poll() is None:
        time.sleep(0.5)
        running = study.get_trials(states=(TrialState.RUNNING,))
        victim = next(
            (
                t
                for t in running
                if t.user_attrs.get("worker", "").endswith(f":{b.pid}")
                and has_checkpoint(t.user_attrs.get("out_dir"))
            ),
            None,
        )
    assert victim is not None, b.communicate()[0] if b.poll() is not None else "no checkpoint from worker 1"
    os.kill(b.pid, signal.SIGKILL)
    b.wait()
    assert study.get_trials()[victim.number].state == TrialState.RUNNING  # killed mid-trial
    run_of_victim = (Path(victim.user_attrs["out_dir"]) / "mlflow_run_id").read_text().strip()

    rerun = worker(config, 1, tmp_path / "w1.json", env)
    for proc in (a, rerun):
        output = proc.communicate(timeout=1200)[0]
        assert proc.returncode == 0, output[-3000:]

    trials = {t.number: t for t in study.get_trials()}
    states = [t.state for t in trials.values()]
    assert states.count(TrialState.COMPLETE) + states.count(TrialState.PRUNED) == 3
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states
    assert trials[0].params == cfg.defaults
    assert trials[victim.number].state == TrialState.FAIL
    (retry,) = [t for t in trials.values() if retry_history(t)[:1] == [victim.number]]
    assert retry.state == TrialState.COMPLETE and retry.params == victim.params
    assert retry.user_attrs["mlflow_run_id"] == run_of_victim  # resumed into the killed trial's run

    client = tracking.client()
    parent = study.user_attrs["mlflow_parent_run_id"]
    for t in trials.values():
        if t.state != TrialState.COMPLETE:
            continue
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == parent and run.data.tags["kind"] == "trial"
        assert run.data.tags["optuna.state"] == "COMPLETE"
        assert int(run.data.params["method.rank"]) == t.params["rank"]
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "time/step_s")]
        assert sorted(steps) == [1, 2, 3, 4, 5, 6]  # one value per tick, also across the kill
        acc = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val/acc")}
        assert acc[6] == t.value

    out = tmp_path / "summary"
    assert main(["sweep", "summary", "--config", str(config), "--study", "e2e", "--out", str(out)]) == 0
    assert json.loads((out / "best_params.json").read_text())["finished"] == 3


def test_a_pruned_real_trial_ends_finished_in_mlflow(env, sweep_dict, tiny_world):
    """An untrained model scores 0: a threshold of 0.5 stops the trial at its first validation (tick 2)."""
    raw = tiny_sweep(
        sweep_dict, tiny_world, n_trials=1, pruner={"name": "threshold", "lower": 0.5, "n_warmup_steps": 0}
    )
    from commrl.sweep.config import SweepConfig
    from commrl.sweep.study import init_study

    cfg = SweepConfig.from_dict(raw)
    init_study(cfg, "pruned")
    record = run_worker(cfg, "pruned", 0)
    assert record["trials"][0]["state"] == "PRUNED"
    trial = open_study(cfg, "pruned").get_trials()[0]
    run = tracking.client().get_run(trial.user_attrs["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["optuna.state"] == "PRUNED" and run.data.tags["stopped_early"].startswith("pruned")
