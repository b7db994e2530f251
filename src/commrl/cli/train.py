"""``commrl train``: one training run of the local driver, configured with Hydra overrides.

    commrl train pair=tiny condition=method seed=0 out_dir=results/runs/tiny/method/seed0
    commrl train --cfg pair=tiny condition=dense        # print the resolved config and exit

Exit status: 0 when every asked tick was trained, 2 on a configuration error (``ConfigError``, a missing
data file included, and a resume of a checkpoint trained under another config: ``commrl.run.fingerprint``;
``commrl.cli.main``), 3 when the run stopped early (collapse alarm) or trained fewer ticks than asked, 75
when SIGUSR1 or SIGTERM (a preemption or time-limit warning) stopped it after a tick and its checkpoint:
rerun the same command to resume.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from commrl.rl.config import compose_train_config, load_train_config
from commrl.run import preempt

EXIT_INCOMPLETE = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. pair=tiny condition=method rl.ticks=20"
    )
    parser.add_argument("--cfg", action="store_true", help="print the resolved config and exit")
    parser.add_argument(
        "--config-dir", type=Path, default=None, help="the Hydra tree (default: configs/train)"
    )


def run(args: argparse.Namespace) -> int:
    if args.cfg:
        import yaml

        print(yaml.safe_dump(compose_train_config(args.overrides, args.config_dir), sort_keys=False))
        return 0
    cfg = load_train_config(args.overrides, args.config_dir)
    from commrl.rl.trainer import LocalTrainer

    try:
        with preempt.watch():
            result = LocalTrainer(cfg).train()
    except preempt.Preempted as stop:
        print(f"commrl train: {stop}; rerun to resume (exit {preempt.EXIT_PREEMPTED})", file=sys.stderr)
        return preempt.EXIT_PREEMPTED
    if not result.complete:
        reason = result.stopped_early or "unknown"
        print(
            f"commrl train: trained {result.ticks_trained} of {result.ticks_asked} ticks (stopped: {reason})",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    print(f"commrl train: {result.ticks_trained} ticks done; final model in {result.final}")
    return 0
