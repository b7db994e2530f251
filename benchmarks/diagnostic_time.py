"""How much of a method run's tick time its gradient-cosine diagnostic takes (a codec replay the byte ledger
leaves out, at the fires of ``method.grad_cosine_every``): the fire ticks with the diagnostic against the
mean of the fire ticks without it, summed, as a share of the run's sampling and training seconds.

    .venv/bin/python benchmarks/diagnostic_time.py results/runs/tiny/method/seed0 [more run folders]

Reads each run's ``metrics.jsonl``: ``time/train_s``, ``time/sample_s``, ``anchor/fire``, and
``anchor/grad_cosine*`` where the diagnostic ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def diagnostic_share(run: Path) -> tuple[float, float]:
    """Seconds the diagnostic added to ``run``'s fire ticks, and the run's tick seconds."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    ticks = [r for r in rows if "time/train_s" in r]
    fires = [r for r in ticks if r.get("anchor/fire") == 1.0]
    with_it = [r["time/train_s"] for r in fires if any(k.startswith("anchor/grad_cosine") for k in r)]
    without = [r["time/train_s"] for r in fires if not any(k.startswith("anchor/grad_cosine") for k in r)]
    if not with_it or not without:
        raise SystemExit(f"{run}: needs fire ticks with and without the gradient-cosine diagnostic")
    extra = sum(with_it) - len(with_it) * statistics.mean(without)
    return extra, sum(r["time/train_s"] + r["time/sample_s"] for r in ticks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (metrics.jsonl, config.yaml)")
    args = parser.parse_args(argv)
    for run in args.runs:
        extra, total = diagnostic_share(run)
        print(f"{run}: the diagnostic {extra:.2f} s of {total:.1f} s of ticks ({extra / total:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
