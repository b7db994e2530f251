"""``commrl netmodel``: what one tick, and the time to dense's accuracy, would cost on your interconnect.

Nothing is rerun: bytes per tick come from the tracked runs' byte ledger (``bytes: runs``, e.g. the tiny
pair) or the analytic ledger (``bytes: analytic``, pair A), compute from the runs' ``time/*`` or from
``--compute-s``; ``configs/netmodel/pair_<pair>.yaml`` holds the rest (``--config`` another file)::

    commrl netmodel --pair tiny --link 10GbE
    commrl netmodel --pair A --compute-s 400 --bandwidth-gbps 25 --latency-us 5 --stages 4 --dp 8

Bad parameters exit 2 with a message naming the option (``ConfigError``: ``commrl.cli.main``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when the command runs: ``commrl --help`` stays fast
    from commrl.netmodel import Link, NetmodelConfig, NetworkResult
    from commrl.report.stats import Interval

FLAGS = {  # a NetModelError's field -> the option that sets it
    "bandwidth_gbps": "--bandwidth-gbps",
    "latency_us": "--latency-us",
    "interconnect": "--link",
    "layout.stages": "--stages",
    "layout.dp": "--dp",
    "layout.collective": "--collective",
    "layout.micro_batches": "--micro-batches",
    "layout.gathers": "--gathers",
    "layout.reduces": "--reduces",
    "compute.train_s": "--compute-s",
    "compute.method_train_s": "--method-compute-s",
    "compute.sample_s": "--sample-s",
    "compute": "--compute-s",
    "analytic.tokens_per_tick": "--tokens-per-tick",
    "tokens_per_tick": "--tokens-per-tick",
    "target_fraction": "--target-fraction",
    "pair": "--pair",
    "config": "--config",
    "tracking_uri": "--tracking-uri",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pair", required=True, help="the pair (configs/netmodel/pair_<pair>.yaml): tiny, A")
    parser.add_argument("--config", default=None, help="a network-model config instead of the pair's")
    parser.add_argument(
        "--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or results/mlflow.db"
    )
    parser.add_argument(
        "--link",
        action="append",
        default=[],
        metavar="NAME",
        help="a named interconnect (1GbE, 10GbE, IB-EDR, IB-NDR, NVLink4), repeatable; default: the config's",
    )
    parser.add_argument("--bandwidth-gbps", type=float, default=None, help="your link: Gbit/s per direction")
    parser.add_argument("--latency-us", type=float, default=None, help="your link: microseconds per message")
    parser.add_argument("--stages", type=int, default=None, help="pipeline stages (default: the config's)")
    parser.add_argument("--dp", type=int, default=None, help="data-parallel replicas (default: the config's)")
    parser.add_argument("--collective", default=None, help="weight update: allreduce | rs_ag")
    parser.add_argument(
        "--micro-batches", type=int, default=None, help="micro-batches per pass and replica (the config's)"
    )
    parser.add_argument(
        "--gathers",
        type=int,
        default=None,
        help="rs_ag: parameter all-gathers per tick (default: the config's; null there: one per traversal "
        "and micro-batch, FSDP's reshard_after_forward)",
    )
    parser.add_argument(
        "--reduces",
        type=int,
        default=None,
        help="rs_ag: gradient reduce-scatters per tick (default: the config's; null there: one per "
        "micro-batch, as verl's FSDP engine runs; 1: accumulated, once per update)",
    )
    parser.add_argument(
        "--compute-s", type=float, default=None, help="analytic pairs: dense trainer compute per tick (s)"
    )
    parser.add_argument(
        "--method-compute-s", type=float, default=None, help="the method's (default: --compute-s)"
    )
    parser.add_argument("--sample-s", type=float, default=None, help="generation per tick (s), both")
    parser.add_argument("--tokens-per-tick", type=int, default=None, help="analytic pairs: tokens per tick")
    parser.add_argument("--target-fraction", type=float, default=None, help="target: this x dense's final")
    parser.add_argument("--figures", default=None, metavar="DIR", help="also draw the figures into DIR")


def _links(args: argparse.Namespace, config_links: Sequence[str]) -> list[Link]:
    from commrl.netmodel.links import Link, NetModelError, named_link

    links = [named_link(name) for name in args.link]
    custom = (args.bandwidth_gbps, args.latency_us)
    if any(v is not None for v in custom):
        if args.bandwidth_gbps is None or args.latency_us is None:
            missing = "bandwidth_gbps" if args.bandwidth_gbps is None else "latency_us"
            raise NetModelError(missing, f"{missing} is missing: a link of your own needs both numbers")
        links.append(Link("custom", args.bandwidth_gbps, args.latency_us, "given on the command line"))
    return links or [named_link(name) for name in config_links]


def _config(args: argparse.Namespace) -> NetmodelConfig:
    from commrl.netmodel.config import load_config, pair_config_path
    from commrl.netmodel.inputs import Compute

    cfg = load_config(args.config or pair_config_path(args.pair))
    moved = [
        flag for flag, value in (("--dp", args.dp), ("--tokens-per-tick", args.tokens_per_tick)) if value
    ]
    if moved and args.micro_batches is None and cfg.layout.micro_batches > 1:
        print(
            f"commrl netmodel: note: with {' and '.join(moved)} the layout keeps the config's "
            f"{cfg.layout.micro_batches} micro-batches per pass and replica (its layout.micro_batches, "
            "worked out for its own data parallelism and tokens), and the gathers and reduce-scatters "
            "counted from them; give --micro-batches for this layout",
            file=sys.stderr,
        )
    compute = None
    if any(v is not None for v in (args.compute_s, args.method_compute_s, args.sample_s)):
        compute = Compute(args.compute_s, args.method_compute_s, args.sample_s, "given on the command line")
    return cfg.with_overrides(
        stages=args.stages,
        dp=args.dp,
        collective=args.collective,
        compute=compute,
        tokens_per_tick=args.tokens_per_tick,
        target_fraction=args.target_fraction,
        micro_batches=args.micro_batches,
        gathers=args.gathers,
        reduces=args.reduces,
    )


def _cell(value: Interval | None) -> str:
    """``n/a``; an interval as ``mean ± half-width`` or ``mean [low, high]`` (seeds in the header)."""
    if value is None:
        return "n/a"
    if value.low is None or value.high is None:
        return f"{value.estimate:.5g}"
    if value.symmetric:
        return f"{value.estimate:.5g} ± {value.half_width:.2g}"
    return f"{value.estimate:.5g} [{value.low:.4g}, {value.high:.4g}]"


def format_result(result: NetworkResult) -> str:
    """The result as a small fixed-width table with its header lines."""
    from commrl.netmodel.analysis import BOUNDS, DENSE

    pi = result.inputs
    c = pi.compressed
    seeds = ", ".join(f"{k} {len(pi.ticks.get(k, {}))}" for k in pi.conditions)
    lines = [
        f"pair {pi.label}: {pi.compute_note}",
        f"layout: {pi.layout.describe()}",
        f"target: {result.target.describe() if result.target else 'none (no time to target)'}",
    ]
    if pi.source == "runs":
        lines.append(f"runs per condition: {seeds}; intervals: 95% over seeds (commrl.report.stats)")
    header = ["link", "Gbit/s", "lat us", "overlap", "dense comm s", f"{c} comm s"]
    if pi.compute_known:
        header += ["dense tick s", f"{c} tick s", "speed-up"]
    if result.target:
        header += ["dense to target s", f"{c} to target s", "speed-up to target"]
    rows = []
    for r in result.rows:
        if not pi.compute_known and r.overlap:
            continue  # without compute both bounds are the communication time
        row = [r.link.name, f"{r.link.bandwidth_gbps:g}", f"{r.link.latency_us:g}"]
        row += [BOUNDS[r.overlap] if pi.compute_known else "-", _cell(r.comm[DENSE]), _cell(r.comm[c])]
        if pi.compute_known:
            row += [_cell(r.tick[DENSE]), _cell(r.tick[c]), _cell(r.tick_speedup)]
        if result.target:
            targets = [r.target[DENSE], r.target[c]]
            row += [
                f"{_cell(t.interval())} ({t.reached_text()} seeds)"
                if t.seconds
                else f"never ({t.reached_text()})"
                for t in targets
            ]
            row.append(_cell(r.target_speedup))
        rows.append(row)
    widths = [max(len(x) for x in column) for column in zip(header, *rows, strict=True)]
    table = [" | ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)) for row in (header, *rows)]
    table.insert(1, "-+-".join("-" * w for w in widths))
    lines += ["", *table, ""]
    for overlap, x in result.crossovers.items():
        lines.append(f"crossover, {BOUNDS[overlap]}: {x.describe()}")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from commrl.cli.main import fail
    from commrl.errors import ConfigError
    from commrl.netmodel.analysis import evaluate
    from commrl.netmodel.config import pair_inputs
    from commrl.netmodel.links import NetModelError
    from commrl.report.runs import ReportInputError

    try:
        cfg = _config(args)
        links = _links(args, cfg.interconnects)
        result = evaluate(pair_inputs(cfg, args.tracking_uri), links, cfg.sweep, cfg.target_fraction)
    except NetModelError as err:
        flag = FLAGS.get(err.field)
        raise ConfigError(f"{flag}: {err}" if flag else str(err)) from None
    except ReportInputError as err:
        return fail("netmodel", f"--pair/--tracking-uri: {err}")
    print(format_result(result))
    if args.figures:
        from pathlib import Path

        from commrl.report.network import network_section
        from commrl.report.style import condition_colours

        out = Path(args.figures)
        out.mkdir(parents=True, exist_ok=True)
        section = network_section(result, out, condition_colours(result.inputs.conditions))
        for figure in section.figures:
            print(
                f"figure: {out / figure.file}"
                if figure.drawn
                else f"figure skipped: {'; '.join(figure.notes)}"
            )
    return 0
