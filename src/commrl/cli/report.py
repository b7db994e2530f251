"""``commrl report``: the note's figures, tables and claims from the MLflow store, into one directory."""

from __future__ import annotations

import argparse


def _threshold(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError(text)
        return name.strip(), float(value)
    except ValueError:
        message = f"{text!r}: expected NAME=NUMBER, e.g. dense_min_gain=0.05"
        raise argparse.ArgumentTypeError(message) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pair",
        action="extend",
        nargs="+",
        default=[],
        help="pairs to report (repeatable; default: every commrl/<pair> experiment)",
    )
    parser.add_argument(
        "--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or results/mlflow.db"
    )
    parser.add_argument("--out", default="results/report", help="output directory (replaced as a whole)")
    parser.add_argument(
        "--netmodel",
        default=None,
        metavar="DIR",
        help="also draw the network section (tick time against bandwidth, time to target) from "
        "DIR/pair_*.yaml, e.g. configs/netmodel",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        metavar="PATH",
        help="read only the runs these files name (training summary.json files or run folders, evaluation "
        "summary .json files, sweep summary folders), not every run of the pair in the store: a "
        "pipeline's report of its own runs",
    )
    parser.add_argument(
        "--threshold",
        action="append",
        type=_threshold,
        default=[],
        metavar="NAME=VALUE",
        help="override a claim threshold (see commrl.report.ClaimThresholds), repeatable",
    )


def run(args: argparse.Namespace) -> int:
    from commrl.cli.main import fail
    from commrl.report import ClaimThresholds, ReportInputError, build_report
    from commrl.report.network import NetworkOptions
    from commrl.report.selection import RunSelection

    try:
        thresholds = ClaimThresholds.with_overrides(dict(args.threshold))
        network = NetworkOptions.from_dir(args.netmodel) if args.netmodel else None
        only = RunSelection.from_paths(args.only) if args.only is not None else None
        result = build_report(
            args.pair,
            args.out,
            tracking_uri=args.tracking_uri,
            thresholds=thresholds,
            network=network,
            only=only,
        )
    except ReportInputError as err:
        return fail("report", err)
    drawn = sum(f.drawn for f in result.figures)
    print(
        f"report of {', '.join(result.pairs)} in {result.out_dir}: {drawn} figures, "
        f"{len(result.notes)} notes; MLflow run {result.run_id}"
    )
    for pair, claims in result.claims.items():
        print(f"  {pair}: " + ", ".join(f"{c.number} {c.status}" for c in claims))
    return 0
