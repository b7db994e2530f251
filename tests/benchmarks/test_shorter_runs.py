"""benchmarks/shorter_runs.py: earlier read points, the README's numbers for issue 16's "fewer ticks"."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from commrl.run.summary import RunSummary

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "shorter_runs.py"
spec = importlib.util.spec_from_file_location("shorter_runs", SCRIPT)
shorter_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shorter_runs)


def summary(condition: str, seed: int, acc: dict[int, float], ticks: int = 40) -> RunSummary:
    return RunSummary(
        pair="tiny",
        condition=condition,
        seed=seed,
        driver="local",
        ticks_asked=40,
        ticks_trained=ticks,
        mlflow_run_id=None,
        final=None,
        read_at=40,
        read=None,
        val_acc=acc,
        time_s={
            "setup_models": 2.0,
            "tracking": 1.0,
            "sample": 8.0,
            "train": 20.0,
            "push_weights": 0.0,
            "validate": 5.0,
            "checkpoint": 0.4,
        },
    )


def test_job_seconds_scales_the_ticks_and_the_validations_and_keeps_the_rest():
    run = summary("dense", 0, {0: 0.5, 10: 0.6, 20: 0.6, 30: 0.7, 40: 0.7})
    assert shorter_runs.job_seconds(run, 40) == pytest.approx(36.4)
    # half the ticks: 14 s of sampling and training, 0.2 s of checkpoints, 3 of 5 validations, 3 s kept whole
    assert shorter_runs.job_seconds(run, 20) == pytest.approx(14.0 + 0.2 + 3.0 + 3.0)


def test_prints_each_read_point_with_paired_differences_and_skips_incomplete_runs(tmp_path):
    for seed, (d, m) in enumerate([(0.6, 0.5), (0.7, 0.55), (0.8, 0.75)]):
        summary("dense", seed, {0: 0.5, 20: d, 40: d + 0.1}).write(tmp_path / "dense" / f"seed{seed}")
        summary("method", seed, {0: 0.5, 20: m, 40: m + 0.1}).write(tmp_path / "method" / f"seed{seed}")
    summary("method", 3, {0: 0.5, 20: 0.0}, ticks=20).write(tmp_path / "method" / "seed3")  # stopped early
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "--diff", "method-dense"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "6 runs, 2 conditions, seeds per condition [3]" in out.stdout
    tick20 = out.stdout.split("tick 20 ")[1].split("tick 40")[0]
    assert "50% of the ticks" in tick20
    assert "method - dense: -0.100 [" in tick20  # paired by seed: -0.1, -0.15, -0.05
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "--diff", "method-x"], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "no runs of 'x'" in bad.stderr
