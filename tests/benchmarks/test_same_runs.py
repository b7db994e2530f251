"""benchmarks/same_runs.py: the check the README quotes for "a speed-up changed no run"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "same_runs.py"


def write_run(root: Path, rows: list[dict], weight: float) -> None:
    run = root / "tiny" / "method" / "seed0"
    (run / "final").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    save_file({"w": torch.full((2, 2), weight)}, run / "final" / "model.safetensors")


def same_runs(base: Path, other: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(base), str(other), *args], capture_output=True, text=True
    )


def test_same_runs_tells_a_changed_value_or_weight_from_a_sparser_diagnostic(tmp_path):
    every = [{"step": 1, "loss": 0.5, "time/step_s": 1.0, "cos": 0.1}, {"step": 2, "loss": 0.4, "cos": 0.2}]
    fewer = [{"step": 1, "loss": 0.5, "time/step_s": 2.0, "cos": 0.1}, {"step": 2, "loss": 0.4}]
    write_run(tmp_path / "a", every, 1.0)
    write_run(tmp_path / "b", fewer, 1.0)
    write_run(tmp_path / "c", [{**fewer[0], "loss": 0.5000001}, fewer[1]], 1.0)
    write_run(tmp_path / "d", fewer, 1.5)
    write_run(tmp_path / "e", [fewer[0], {"step": 2, "loss": 0.4, "cos": 0.3}], 1.0)
    ok = same_runs(tmp_path / "a", tmp_path / "b", "--sparse", "cos")
    assert ok.returncode == 0, ok.stdout
    assert "1 the same" in ok.stdout and "2 in base, 1 in other" in ok.stdout
    assert same_runs(tmp_path / "a", tmp_path / "b").returncode == 1  # cos is not declared sparse
    for changed, what in (("c", "step 1 loss"), ("d", "final weights differ"), ("e", "step 2 cos")):
        out = same_runs(tmp_path / "a", tmp_path / changed, "--sparse", "cos")
        assert out.returncode == 1 and what in out.stdout, (changed, out.stdout)
