"""Which layout of training jobs on a 2-core machine finishes them soonest: two jobs side by side with one
thread each (the pipeline's: `resources.train.threads: 1`, `snakemake --cores 2`), or the same two jobs one
after the other with two threads each (`threads: 2`).

Each repetition runs both layouts on the same two runs (method, seeds 0 and 1, the tiny pair's defaults),
alternating which goes first; the ratio is of the layouts' wall times, median over repetitions, > 1 when the
side-by-side layout is faster.

    .venv/bin/python benchmarks/bench_layout.py [--repeat 1] [--condition method]

Needs the tiny base model and the toy data:
`snakemake --cores 2 results/models/tiny-base/base_accuracy.json`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_job import finish_job, start_job

SEEDS = (0, 1)


def side_by_side(condition: str, root: Path) -> float:
    """Wall seconds of the two runs started together, one thread each."""
    start = time.perf_counter()
    jobs = [
        (start_job([], condition, root / f"s{seed}" / "run", seed=seed), root / f"s{seed}" / "run")
        for seed in SEEDS
    ]
    for (proc, started), out in jobs:
        finish_job(proc, started, out)
    return time.perf_counter() - start


def one_after_the_other(condition: str, root: Path) -> float:
    """Wall seconds of the two runs one after the other, two threads each."""
    start = time.perf_counter()
    for seed in SEEDS:
        out = root / f"q{seed}" / "run"
        finish_job(*start_job([], condition, out, threads=2, seed=seed), out)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--condition", default="method")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    ratios = []
    with tempfile.TemporaryDirectory(prefix="bench-layout-") as tmp:
        for k in range(args.repeat):
            layouts = [("side_by_side", side_by_side), ("one_after_the_other", one_after_the_other)]
            walls = {}
            for name, layout in layouts if k % 2 == 0 else layouts[::-1]:
                walls[name] = layout(args.condition, Path(tmp) / f"{name}-{k}")
                print(f"[#{k}] {name}: {walls[name]:.1f} s for {len(SEEDS)} runs", file=sys.stderr)
            ratios.append(walls["one_after_the_other"] / walls["side_by_side"])
    print(
        f"{args.condition} x {len(SEEDS)} seeds, tiny pair: wall(one after the other, 2 threads) / "
        f"wall(side by side, 1 thread) = {statistics.median(ratios):.3f}x (median of {len(ratios)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
