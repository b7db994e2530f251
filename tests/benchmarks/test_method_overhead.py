"""benchmarks/bench_method_overhead.py runs (the README's 1.25x row; a renamed config field once broke it
unnoticed) and prints each case's median ratio with its interval."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_method_overhead.py"


def test_the_overhead_benchmark_runs_and_prints_each_ratio_with_its_interval(tmp_path):
    out = tmp_path / "overhead.json"
    args = [sys.executable, str(SCRIPT), "--reps", "6", "--case", "tiny", "--out", str(out)]
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    results = {r["case"]: r for r in json.loads(out.read_text())}
    assert set(results) == {"tiny"}  # the 1.5B-shaped layer's case takes ~30 s more
    for r in results.values():
        assert (
            len(r["ratios"]) == 6
            and r["ratio_low"] == min(r["ratios"])
            and r["ratio_high"] == max(r["ratios"])
        )
        line = next(row for row in done.stdout.splitlines() if row.startswith(r["case"]))
        assert (
            f"{r['ratio_median']:.3f}x" in line and f"[{r['ratio_low']:.3f}, {r['ratio_high']:.3f}]" in line
        )
