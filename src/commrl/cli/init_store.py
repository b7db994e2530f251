"""``commrl init-store``: create the MLflow store and the experiments of the given pairs, once."""

from __future__ import annotations

import argparse

from commrl import tracking


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pair", action="append", default=[], help="create experiment commrl/<pair> (repeatable)"
    )
    parser.add_argument(
        "--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or results/mlflow.db"
    )
    parser.add_argument(
        "--stamp", default=None, help="write the URI to this file when done (a Snakemake output)"
    )


def run(args: argparse.Namespace) -> int:
    names = [tracking.experiment_name(p) for p in args.pair]
    uri = tracking.init_store(names, tracking_uri=args.tracking_uri)
    if args.stamp:
        from pathlib import Path

        Path(args.stamp).parent.mkdir(parents=True, exist_ok=True)
        Path(args.stamp).write_text(uri + "\n")
    print(f"MLflow store ready: {uri} ({', '.join(names) or 'no experiments'})")
    return 0
