"""Where a finished pipeline's time went: every job's Snakemake ``benchmark:`` file (results/benchmarks/),
summed per kind of job (the folder under results/benchmarks/), with the kind's share of all jobs' seconds.

    .venv/bin/python benchmarks/pipeline_time.py [--root results/benchmarks] [--by condition]

``--by condition`` splits the training jobs by condition. Seconds are each job's wall time (``s``); on 2
cores with two one-thread jobs side by side, the pipeline's wall time is about half the jobs' sum, plus the
stretches where one job runs alone (pretraining takes both cores).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def read_jobs(root: Path) -> list[tuple[Path, dict[str, float]]]:
    """Every benchmark file under ``root`` with its last row (a retried job's last attempt)."""
    jobs = []
    for path in sorted(root.rglob("*.tsv")):
        with path.open() as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        if rows:
            jobs.append((path.relative_to(root), {k: float(v) for k, v in rows[-1].items() if _number(v)}))
    return jobs


def _number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def group_of(path: Path, by: str | None) -> str:
    kind = path.parts[0]
    if by == "condition" and kind == "train" and len(path.parts) >= 4:
        return f"train {path.parts[2]}"
    return kind


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--by", choices=("condition",), default=None)
    args = parser.parse_args(argv)
    jobs = read_jobs(args.root)
    if not jobs:
        print(f"no benchmark files under {args.root}: run the pipeline first", file=sys.stderr)
        return 1
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for path, row in jobs:
        groups[group_of(path, args.by)].append(row)
    total = sum(row["s"] for _, row in jobs)
    print(f"{'jobs':<28}{'n':>4}{'sum s':>10}{'median s':>10}{'share':>8}")
    for name, rows in sorted(groups.items(), key=lambda item: -sum(r["s"] for r in item[1])):
        wall = sum(r["s"] for r in rows)
        median = statistics.median(r["s"] for r in rows)
        print(f"{name:<28}{len(rows):>4}{wall:>10.0f}{median:>10.1f}{wall / total:>8.0%}")
    print(f"{'all':<28}{len(jobs):>4}{total:>10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
