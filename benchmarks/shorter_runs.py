"""What would shorter runs say? A finished pipeline's runs read at each earlier validation tick.

Issue 16's 12-minute target needs ~1.7x less training work per run; fewer ticks is the obvious lever. A run
stopped at tick t is the same run as the first t ticks of a longer one (a constant learning rate; nothing
else reads ``rl.ticks``), so a finished pipeline already holds every shorter pipeline's validation: this
prints, at each validation tick, each condition's mean val/acc and the paired differences the report's
claims rest on (``commrl.report.stats``: seeds paired, t interval), with the share of a run's ticks spent to
get there and the training jobs' time it would take (each job's phases scaled by the ticks and validations
they would run; start-up and tracking kept whole: an estimate, not a measurement).

    .venv/bin/python benchmarks/shorter_runs.py results/runs/tiny
    .venv/bin/python benchmarks/shorter_runs.py results/runs/tiny --diff method-dense --diff method-prf_mask
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from commrl.report.stats import Interval, difference_interval, mean_interval
from commrl.run.summary import RunSummary

PER_TICK = ("sample", "train", "push_weights")


def runs(root: Path) -> dict[str, dict[str, RunSummary]]:
    """``{condition: {seed: summary}}`` of every complete run under ``root/<condition>/seed<k>``."""
    found: dict[str, dict[str, RunSummary]] = defaultdict(dict)
    for path in sorted(root.glob("*/seed*/summary.json")):
        summary = RunSummary.read(path)
        if summary.complete:
            found[summary.condition][str(summary.seed)] = summary
    return dict(found)


def job_seconds(summary: RunSummary, tick: int) -> float:
    """A run's training-job seconds had it stopped at ``tick``: per-tick phases scaled by the ticks, the
    validation by the validations, checkpoints by the ticks; the rest (set-up, tracking) whole."""
    time_s = summary.time_s
    ticks_share = tick / summary.ticks_trained
    validations = sum(t <= tick for t in summary.val_acc) / len(summary.val_acc)
    scaled = sum(time_s.get(k, 0.0) for k in PER_TICK) * ticks_share
    scaled += time_s.get("validate", 0.0) * validations + time_s.get("checkpoint", 0.0) * ticks_share
    return scaled + sum(v for k, v in time_s.items() if k not in (*PER_TICK, "validate", "checkpoint"))


def text(interval: Interval) -> str:
    half = (interval.high - interval.low) / 2
    return f"{interval.estimate:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}] (±{half:.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="a pair's runs folder, e.g. results/runs/tiny")
    parser.add_argument(
        "--diff",
        action="append",
        default=None,
        metavar="A-B",
        help="paired differences to print (default: method-dense, method-anchor_only)",
    )
    args = parser.parse_args()
    by_condition = runs(args.runs)
    if not by_condition:
        sys.exit(
            f"no complete run under {args.runs}/<condition>/seed<k>/summary.json: run the pipeline first"
        )
    diffs = [d.split("-", 1) for d in (args.diff or ["method-dense", "method-anchor_only"])]
    if any(len(d) != 2 for d in diffs):
        sys.exit("--diff takes A-B, two conditions joined by '-', e.g. --diff method-dense")
    for a, b in diffs:
        for name in (a, b):
            if name not in by_condition:
                sys.exit(
                    f"--diff: no runs of {name!r} under {args.runs} (have: {', '.join(sorted(by_condition))})"
                )
    everything = [s for seeds in by_condition.values() for s in seeds.values()]
    ticks = sorted(set.intersection(*(set(s.val_acc) for s in everything)))
    last = max(ticks)
    full = sum(job_seconds(s, s.ticks_trained) for s in everything)
    seeds = sorted({len(v) for v in by_condition.values()})
    print(
        f"{len(everything)} runs, {len(by_condition)} conditions, seeds per condition {seeds}; "
        f"95% t intervals, differences paired by seed"
    )
    for tick in ticks:
        jobs = sum(job_seconds(s, tick) for s in everything)
        print(
            f"\ntick {tick} ({tick / last:.0%} of the ticks; training jobs ~{jobs:.0f} s of {full:.0f} s, "
            f"{jobs / full:.2f}x)"
        )
        for condition, runs_ in sorted(by_condition.items()):
            acc = mean_interval(r.val_acc[tick] for r in runs_.values())
            print(f"  {condition:<22} {acc.estimate:.3f} [{acc.low:.3f}, {acc.high:.3f}]")
        for a, b in diffs:
            pa = {k: r.val_acc[tick] for k, r in by_condition[a].items()}
            pb = {k: r.val_acc[tick] for k, r in by_condition[b].items()}
            print(f"  {a} - {b}: {text(difference_interval(pa, pb))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
