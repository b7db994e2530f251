"""The GPU scripts on a machine without a GPU: they parse, stop with a clear message, and the smoke's checks
read a run the way the smoke's runs write it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import time
from pathlib import Path

import pytest

from commrl import tracking

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_engine_check_parses_help_and_stops_without_cuda(monkeypatch, capsys):
    """``--help`` parses; without CUDA (forced: the check must not start on a GPU machine) exit 2."""
    import torch

    script = load_script("gpu_engine_check")
    with pytest.raises(SystemExit) as done:
        script.main(["--help"])
    assert done.value.code == 0 and "--max-token-len" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert script.main([]) == script.EXIT_NO_GPU
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_gpu_smoke_stops_without_a_gpu_and_writes_nothing(tmp_path):
    """No nvidia-smi on PATH (the script uses only bash builtins before that check): exit 1, OUT untouched."""
    (tmp_path / "bin").mkdir()
    out = tmp_path / "smoke"
    done = subprocess.run(
        ["/bin/bash", str(SCRIPTS / "gpu_smoke.sh")],
        env={"PATH": str(tmp_path / "bin"), "OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and "no NVIDIA GPU" in done.stderr
    assert not out.exists()


def log_smoke_run(client, experiment: str, out: Path, condition: str, ticks: int, lost: tuple[int, ...] = ()):
    """A run as the smoke's ``commrl verl-train`` writes it (summary, HF folders, MLflow metrics and tags),
    without the per-tick metrics of the ``lost`` steps."""
    from mlflow.entities import Metric

    run_id = client.create_run(experiment).info.run_id
    now = int(time.time() * 1000)
    fires = [float(condition == "method" and step % 2 == 1) for step in range(1, ticks + 1)]
    metrics = []
    for step, fire in zip(range(1, ticks + 1), fires, strict=True):
        if step in lost:
            continue
        values = {key: 0.5 for key in load_script("gpu_smoke_check").PER_TICK}
        values.update(
            {"anchor/fire": fire, "comm/ratio_vs_dense": 1.0 if condition == "dense" or fire else 0.3}
        )
        values.update({"mismatch/logprob_corr": 0.99, "health/alarm": 0.0})
        if fire:
            values["anchor/projection_distance"] = 0.0 if step == 1 else 0.05
        metrics += [Metric(key, value, now, step) for key, value in values.items()]
    for step in (0, *range(2, ticks + 1, 2)):
        metrics += [
            Metric(key, 0.6, now, step) for key in ("val/acc", "val-core/commrl/toy_arith/acc/mean_at_1")
        ]
    client.log_batch(run_id, metrics=metrics)
    if condition == "method":
        client.set_tag(
            run_id,
            "config_changed",
            "actor_rollout_ref/actor/optim/total_training_steps,trainer/total_training_steps",
        )
    run = out / "runs" / condition
    for folder in ("final", "tick2"):
        (run / folder).mkdir(parents=True, exist_ok=True)
        (run / folder / "config.json").write_text("{}")
    summary = {"complete": True, "ticks_trained": ticks, "ticks_asked": ticks, "mlflow_run_id": run_id}
    (run / "summary.json").write_text(json.dumps(summary))


def test_gpu_smoke_check_passes_a_good_smoke_and_flags_a_lost_resume(tmp_path, monkeypatch, capsys):
    """A smoke whose runs logged every tick passes; a method run whose resumed ticks (5, 6) reached no
    MLflow (verl's own MLflow set-up on a changed config) fails, naming the metric and the steps."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = tracking.client(uri)
    experiment = client.create_experiment("commrl/A")
    check = load_script("gpu_smoke_check")
    for name, lost in (("good", ()), ("lost", (5, 6))):
        out = tmp_path / name
        log_smoke_run(client, experiment, out, "dense", 4)
        log_smoke_run(client, experiment, out, "method", 6, lost)
        assert check.main(["--out", str(out), "--ticks", "4"]) == (1 if lost else 0), name
    printed = capsys.readouterr().out
    assert "method: score/mean logged at steps [1, 2, 3, 4], want [1, 2, 3, 4, 5, 6]" in printed
    assert printed.count("gpu_smoke: all checks passed") == 1
