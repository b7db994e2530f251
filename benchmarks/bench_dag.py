"""Wall time of the workflow's DAG: `snakemake -n` on the paper config (target <= 3 s), or with --full the
whole tiny pipeline run for real (`snakemake --cores 2`) in a private copy of the workflow.

    .venv/bin/python benchmarks/bench_dag.py                 # paper dry-run, median of 5
    .venv/bin/python benchmarks/bench_dag.py --config configs/pipeline/tiny.yaml --repeat 3
    .venv/bin/python benchmarks/bench_dag.py --full          # the tiny pipeline end to end (minutes)
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_FILES = ["Snakefile", "workflow", "configs", "envs", "profiles", "assets"]
TARGET_DRY_RUN_S = 3.0


def copy_workflow(dest: Path) -> None:
    """The files a run needs, so that a benchmark never touches the checkout's results/ or .snakemake/."""
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)


def timed_snakemake(args: list[str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one `snakemake` process; CPU time is what a busy machine does not inflate."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [sys.executable, "-m", "snakemake", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"snakemake {' '.join(args)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", default="configs/pipeline/paper.yaml", help="pipeline config of the dry-run"
    )
    parser.add_argument("--repeat", type=int, default=5, help="dry-runs to time (the median is reported)")
    parser.add_argument("--full", action="store_true", help="run the whole tiny pipeline instead (minutes)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")

    with tempfile.TemporaryDirectory(prefix="commrl-bench-dag-") as tmp:
        root = Path(tmp)
        copy_workflow(root)
        if args.full:
            wall, cpu = timed_snakemake(["--cores", "2", "--configfile", "configs/pipeline/tiny.yaml"], root)
            print(f"tiny pipeline end to end (snakemake --cores 2): {wall:.1f} s wall, {cpu:.1f} s CPU")
            return 0
        dry_run = ["-n", "--configfile", args.config]
        runs = [timed_snakemake(dry_run, root) for _ in tqdm(range(args.repeat), desc="snakemake -n")]
    wall = statistics.median(w for w, _ in runs)
    cpu = statistics.median(c for _, c in runs)
    verdict = "ok" if wall <= TARGET_DRY_RUN_S else "OVER TARGET"
    print(
        f"snakemake -n --configfile {args.config}: median {wall:.2f} s wall, {cpu:.2f} s CPU over "
        f"{len(runs)} runs (wall min {min(w for w, _ in runs):.2f}, max {max(w for w, _ in runs):.2f}); "
        f"target <= {TARGET_DRY_RUN_S:.0f} s wall: {verdict}; load average {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
