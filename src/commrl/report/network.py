"""From bytes to seconds: the network model's figures and tables (``commrl.netmodel``), one section per
network config (``configs/netmodel/pair_<pair>.yaml``): a pair's tracked runs, or a paper pair's analytic
ledger.

- Figure 12, tick time against bandwidth (log axes, ``sweep.low_gbps`` to ``sweep.high_gbps``): dense and the
  compressed condition, no overlap (solid) and full overlap (dashed), the crossover bandwidth of each bound
  (where the method stops saving ``sweep.tolerance`` of dense's tick) and the named interconnects. Without
  compute times (an analytic pair with no sourced GPU time): communication time per tick, and the crossover
  as a function of an assumed compute time per tick (the same for both conditions).
- Figure 13, time to the target validation accuracy at the named interconnects, both bounds: the seed mean
  (bars) and its 95% interval (whiskers) over the seeds that reached it, ``k/n`` seeds reached.
- Tables ``network_links`` (per interconnect and bound; one row per interconnect when no compute time is
  known, where both bounds are the communication time: ``COMM_ONLY``) and ``network_crossover``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from commrl.netmodel.analysis import (
    ANALYTIC_SEED,
    BOUNDS,
    DENSE,
    NetworkResult,
    crossover,
    evaluate,
    mean_curve,
)
from commrl.netmodel.config import NetmodelConfig, config_dir, load_config, pair_inputs
from commrl.netmodel.cost import Crossover
from commrl.netmodel.links import Link, NetModelError, named_link
from commrl.report.figures import DPI, FigureResult, file_name, whiskers
from commrl.report.runs import PairRuns
from commrl.report.stats import Interval
from commrl.report.tables import Cell, Table

TICK_FIGURE, TARGET_FIGURE = 12, 13
COMPUTE_GRID_S = np.geomspace(1.0, 1e4, 25)  # assumed compute per tick, when none is known
MODEL_GUIDE = (
    "Network model (commrl.netmodel): each channel of the byte ledger costs latency + bytes / bandwidth "
    "(alpha-beta model, bandwidth per direction). Stage boundaries are point to point and pipelined: each "
    "of the n traversals a tick counts (every counted pass's forward, each backward) sends one compression "
    "point's share of one replica's tokens, A / (P D), across the S - 1 boundaries in m micro-batches, "
    "m + S - 2 transfers on the critical path: (m + S - 2) / m * A / (P D) bytes and n (m + S - 2) "
    "latencies; the basis refresh sends R / P per boundary; each stage reduces its own parameters' share of "
    "the weight update across the D replicas, the largest share setting the time (W / S where the runs give "
    "no model shape), by ring all-reduce, 2(D-1)/D * bytes + 2(D-1) latencies (DDP; a compressed update "
    "sends PowerSGD's factors instead, as its hook does), or (FSDP) u reduce-scatters of the dense "
    "gradients, (D-1)/D * bytes + (D-1) latencies each (u: the layout's reduces, else one per micro-batch, "
    "as verl runs it; a compressed update's factors are ring all-reduced after them, as verl's engine "
    "compresses the reduced shards), then g all-gathers of the parameters, dense, (D-1)/D * their bytes at "
    "their own element size (FSDP's mixed-precision param_dtype, bf16 in verl by default, against the "
    "gradients' fp32: param_bytes / grad_bytes of the dense update's bytes; g: the layout's gathers, else "
    "one per traversal and micro-batch, FSDP's reshard_after_forward). "
    "Channels run in turn. Bounds: no overlap, tick = sampling + training compute + "
    "communication; full overlap, tick = sampling + max(training compute, communication). Time to target: "
    "the modelled seconds of the ticks up to the first validation at or above the target. Intervals of "
    "seconds (tick, communication, to target) are cut at 0 s where a t-interval reaches below it: a time is "
    "never negative, and the cut keeps the interval's coverage."
)
COMM_ONLY = "bounds coincide (communication only: no compute time)"


@dataclass(frozen=True)
class NetworkOptions:
    """The network configs the report draws a section for (``bytes: runs`` needs its pair in the report)."""

    configs: tuple[NetmodelConfig, ...]

    @classmethod
    def from_dir(cls, directory: str | Path | None = None) -> NetworkOptions:
        """Every ``pair_*.yaml`` of ``directory`` (default ``commrl.netmodel.config.config_dir()``)."""
        root = Path(directory) if directory is not None else config_dir()
        return cls(tuple(load_config(p) for p in sorted(root.glob("pair_*.yaml"))))


@dataclass
class NetworkSection:
    """One network config's figures, tables and notes; ``key`` is ``<pair>-<source>``."""

    key: str
    title: str
    summary: str
    figures: list[FigureResult]
    tables: list[Table]
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """What ``tables.json`` keeps under ``network``."""
        return {
            "title": self.title,
            "summary": self.summary,
            "notes": self.notes,
            "tables": {t.key: t.as_dict() for t in self.tables},
        }


def network_sections(
    loaded: Sequence[PairRuns],
    options: NetworkOptions,
    tracking_uri: str | None,
    out_dir: Path,
    colours: dict[str, str],
) -> tuple[list[NetworkSection], list[str]]:
    """A section per config, and notes on the configs that could not be drawn (the report goes on)."""
    by_pair = {runs.pair: runs for runs in loaded}
    sections, notes = [], []
    for cfg in options.configs:
        runs = by_pair.get(cfg.pair)
        if runs is None:
            if cfg.source == "runs":
                notes.append(
                    f"network model of pair {cfg.pair} skipped: the report does not include the pair"
                )
                continue
            runs = PairRuns(cfg.pair, [], [], [])
            notes.append(
                f"network model of pair {cfg.pair}: the report does not include its runs, no time to target"
            )
        try:
            result = evaluate(
                pair_inputs(cfg, tracking_uri, runs),
                [named_link(n) for n in cfg.interconnects],
                cfg.sweep,
                cfg.target_fraction,
            )
        except NetModelError as err:
            notes.append(f"network model of pair {cfg.pair} ({cfg.source}) skipped: {err}")
            continue
        sections.append(network_section(result, out_dir, colours))
    return sections, notes


def summary(result: NetworkResult) -> str:
    """Where the bytes and compute come from, the layout and the target, in one paragraph."""
    pi = result.inputs
    seeds = ", ".join(f"{c} n={len(pi.ticks.get(c, {}))}" for c in pi.conditions)
    source = (
        f"bytes per tick from the runs' byte ledger ({seeds})"
        if pi.source == "runs"
        else "bytes per tick from the analytic ledger (every pass verl's engine counts: engine_passes)"
    )
    target = result.target.describe() if result.target else "no target (see the notes)"
    return f"{source}; {pi.compute_note}. Layout: {pi.layout.describe()}. Target: {target}."


def network_section(result: NetworkResult, out_dir: Path, colours: dict[str, str]) -> NetworkSection:
    pi = result.inputs
    figures = [tick_time_figure(result, out_dir, colours), target_figure(result, out_dir, colours)]
    notes = list(result.notes) + [n for f in figures for n in f.notes]
    tables = [links_table(result), crossover_table(result)]
    return NetworkSection(f"{pi.pair}-{pi.source}", pi.label, summary(result), figures, tables, notes)


def _links_in_range(result: NetworkResult) -> list[Link]:
    sweep = result.sweep
    return [
        r.link
        for r in result.rows
        if not r.overlap and sweep.low_gbps <= r.link.bandwidth_gbps <= sweep.high_gbps
    ]


def links_caption(result: NetworkResult) -> str:
    """``Dotted: the named interconnects`` and those left off, outside the plotted bandwidths."""
    drawn = _links_in_range(result)
    off = [r.link for r in result.rows if not r.overlap and r.link not in drawn]
    text = "Dotted: the named interconnects"
    if not off:
        return text + "."
    sweep = result.sweep
    names = ", ".join(f"{link.name} ({link.bandwidth_gbps:g} Gbit/s)" for link in off)
    return (
        f"{text}; outside the plotted {sweep.low_gbps:g}-{sweep.high_gbps:g} Gbit/s and not drawn: {names}."
    )


def averaging_caption(result: NetworkResult) -> str:
    """How a tick time is averaged: over a run's ticks then seeds, or over the analytic schedule's ticks."""
    pi = result.inputs
    if pi.source == "runs":
        return "mean over the ticks of a run, then over seeds"
    ticks = len(pi.tick_inputs(DENSE, ANALYTIC_SEED))
    return f"mean over the {ticks} ticks of the analytic schedule, which has no seeds"


def _mark_links(ax: Axes, links: Sequence[Link]) -> None:
    """A dotted vertical line per named interconnect, named just above the axes."""
    for link in links:
        ax.axvline(link.bandwidth_gbps, color="0.6", linestyle=":", linewidth=1)
        ax.text(
            link.bandwidth_gbps,
            1.01,
            link.name,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize="x-small",
            color="0.35",
        )


def _mark_crossovers(ax: Axes, crossovers: dict[bool, Crossover]) -> None:
    for overlap, c in crossovers.items():
        if c.status == "crossover":
            style = "--" if overlap else "-"
            ax.axvline(
                c.gbps,
                color="black",
                linestyle=style,
                linewidth=0.9,
                label=f"crossover, {BOUNDS[overlap]}: {c.gbps:.3g} Gbit/s",
            )


def _save(fig: Figure, path: Path) -> None:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI, format="png")


def tick_time_figure(result: NetworkResult, out_dir: Path, colours: dict[str, str]) -> FigureResult:
    pi, sweep = result.inputs, result.sweep
    title = "Tick time against bandwidth"
    file = file_name(TICK_FIGURE, f"net_tick_{pi.source}", pi.pair)
    bandwidths = sweep.bandwidths()
    known = pi.compute_known
    fig = Figure(figsize=(12.5 if not known else 7.5, 4.6), layout="constrained")
    axes = fig.subplots(1, 1 if known else 2, squeeze=False)[0]
    ax = axes[0]
    for condition in pi.conditions:
        colour = colours.get(condition, "#ff7f0e")
        bounds = (False, True) if known else (None,)
        for overlap in bounds:
            label = condition if overlap is None else f"{condition}, {BOUNDS[overlap]}"
            ax.plot(
                bandwidths,
                mean_curve(pi, condition, sweep, overlap, len(bandwidths)),
                color=colour,
                linestyle="--" if overlap else "-",
                linewidth=1.5,
                label=label,
            )
    _mark_crossovers(ax, result.crossovers)
    _mark_links(ax, _links_in_range(result))
    ylabel = "seconds per tick" if known else "communication seconds per tick"
    ax.set(xscale="log", xlabel="link bandwidth (Gbit/s per direction)", ylabel=ylabel)
    _log_if_wide(ax)
    ax.set_xlim(sweep.low_gbps, sweep.high_gbps)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="x-small")
    caption = (
        f"Modelled seconds per tick ({averaging_caption(result)}) against the bandwidth of every link, at "
        f"{sweep.latency_us:g} us latency per message; {pi.layout.describe()}. "
    )
    if known:
        caption += (
            "Solid: no overlap (sampling + training compute + communication); dashed: full overlap "
            "(sampling + max(training compute, communication)). Black lines: the crossover of each bound, "
            f"above which the method saves less than {sweep.tolerance:.0%} of dense's tick: "
            + "; ".join(f"{BOUNDS[o]} {c.short()}" for o, c in result.crossovers.items())
            + f". {links_caption(result)} Compute: {pi.compute_note}."
        )
    else:
        right = axes[1]
        for overlap in (False, True):
            points = [crossover(pi.with_train_s(float(c)), sweep, overlap) for c in COMPUTE_GRID_S]
            gbps = [p.gbps if p.status == "crossover" else np.nan for p in points]
            right.plot(
                COMPUTE_GRID_S, gbps, color="black", linestyle="--" if overlap else "-", label=BOUNDS[overlap]
            )
        _mark_links_horizontal(right, _links_in_range(result))
        right.set(
            xscale="log",
            yscale="log",
            xlabel="assumed training compute per tick (s), both conditions",
            ylabel="crossover bandwidth (Gbit/s)",
            title="crossover against compute time",
        )
        right.set_ylim(sweep.low_gbps, sweep.high_gbps)
        right.grid(alpha=0.3, which="both")
        right.legend(fontsize="x-small")
        caption += (
            f"Left: communication seconds per tick (no compute time is known: {pi.compute_note}). Right: the "
            "crossover bandwidth (above it the method saves less than "
            f"{sweep.tolerance:.0%} of dense's tick) if both conditions computed the given seconds per tick "
            "and sampled in no time; solid no overlap, dashed full overlap; a gap where the crossover lies "
            f"outside the bandwidth range. {links_caption(result)}"
        )
    fig.suptitle(f"{title}: pair {pi.label}")
    _save(fig, out_dir / file)
    return FigureResult(file, pi.pair, TICK_FIGURE, title, caption, True)


def _log_if_wide(ax: Axes, ratio: float = 20.0) -> None:
    """A log y axis when the drawn lines span more than ``ratio`` (a linear one reads better otherwise)."""
    values = np.concatenate([line.get_ydata() for line in ax.get_lines() if len(line.get_ydata()) > 2])
    positive = values[np.isfinite(values) & (values > 0)]
    if len(positive) and positive.max() / positive.min() > ratio:
        ax.set_yscale("log")


def _mark_links_horizontal(ax: Axes, links: Sequence[Link]) -> None:
    for link in links:
        ax.axhline(link.bandwidth_gbps, color="0.6", linestyle=":", linewidth=1)
        ax.text(
            1.01,
            link.bandwidth_gbps,
            link.name,
            transform=ax.get_yaxis_transform(),
            va="center",
            fontsize="x-small",
            color="0.35",
        )


def target_figure(result: NetworkResult, out_dir: Path, colours: dict[str, str]) -> FigureResult:
    pi = result.inputs
    title = "Time to the target validation accuracy"
    file = file_name(TARGET_FIGURE, f"net_target_{pi.source}", pi.pair)
    caption = (
        "Modelled seconds until each seed's first validation at or above the target, at the named "
        "interconnects: bars the mean over the seeds that reached it, whiskers its 95% interval (Student t "
        "below 20 seeds, BCa from 20; none with one seed; a lower end below 0 s cut at 0 s, the least a time "
        "can be); k/n: seeds that reached it. Left: no overlap; right: full overlap."
    )
    if result.target is None:
        note = f"Figure {TARGET_FIGURE} skipped ({pi.label}): no target (no compute time or no dense val/acc)"
        return FigureResult(file, pi.pair, TARGET_FIGURE, title, caption, False, (note,))
    rows = {o: [r for r in result.rows if r.overlap == o] for o in (False, True)}
    names = [r.link.name for r in rows[False]]
    fig = Figure(figsize=(max(8.0, 2.2 * len(names) + 2), 4.6), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    x = np.arange(len(names))
    width = 0.38
    heights = []
    for ax, overlap in zip(axes, (False, True), strict=True):
        for i, condition in enumerate(pi.conditions):
            times = [r.target[condition] for r in rows[overlap]]
            intervals = [t.interval() for t in times]
            mean, err = whiskers(intervals)
            heights += [*mean, *(mean + err[1])]
            offset = (i - 0.5) * width
            bars = ax.bar(
                x + offset,
                mean,
                width,
                yerr=err,
                capsize=2,
                color=colours.get(condition, "#ff7f0e"),
                label=condition,
            )
            ax.bar_label(
                bars, [t.reached_text() if t.seconds else "" for t in times], fontsize="x-small", padding=2
            )
            for j, t in enumerate(times):
                if not t.seconds:
                    ax.text(
                        x[j] + offset,
                        0.02,
                        f"never ({t.reached_text()})",
                        transform=ax.get_xaxis_transform(),
                        ha="center",
                        fontsize="x-small",
                        rotation=90,
                    )
        ax.set_xticks(x, names)
        ax.set_xlim(-0.7, len(names) - 0.3)
        ax.set(title=BOUNDS[overlap], xlabel="interconnect")
        ax.grid(axis="y", alpha=0.3, which="both")
    drawn = np.array(heights)[np.isfinite(heights)]
    if len(drawn) and drawn.min() > 0 and drawn.max() / drawn.min() > 20:
        axes[0].set_yscale("log")  # a linear axis hides the short bars; shared with the right panel
    axes[0].set_ylabel("seconds to target")
    axes[1].legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"{title}: pair {pi.label}, val/acc >= {result.target.accuracy:.3g}")
    _save(fig, out_dir / file)
    caption += f" Target: {result.target.describe()}. Compute: {pi.compute_note}."
    return FigureResult(file, pi.pair, TARGET_FIGURE, title, caption, True)


def links_table(result: NetworkResult) -> Table:
    pi = result.inputs
    c = pi.compressed
    columns = [
        "interconnect",
        "Gbit/s",
        "latency (us)",
        "overlap",
        "dense comm (s/tick)",
        f"{c} comm (s/tick)",
        "dense tick (s)",
        f"{c} tick (s)",
        "tick speed-up",
        "dense to target (s)",
        f"{c} to target (s)",
        "speed-up to target",
        f"reached (dense, {c})",
    ]

    def per_tick(value: Interval | None) -> Cell:
        """Analytic inputs are one schedule, not seeds: the number itself."""
        return value.estimate if value is not None and pi.source == "analytic" else value

    rows: list[list[Cell]] = []
    for r in result.rows:
        if not pi.compute_known and r.overlap:
            continue  # without compute both bounds are the communication time: one row, COMM_ONLY
        targets = [r.target.get(DENSE), r.target.get(c)]
        reached = ", ".join(t.reached_text() for t in targets if t is not None) or None
        rows.append(
            [
                r.link.name,
                r.link.bandwidth_gbps,
                r.link.latency_us,
                BOUNDS[r.overlap] if pi.compute_known else COMM_ONLY,
                per_tick(r.comm.get(DENSE)),
                per_tick(r.comm.get(c)),
                per_tick(r.tick.get(DENSE)),
                per_tick(r.tick.get(c)),
                per_tick(r.tick_speedup),
                *(t.interval() if t is not None else None for t in targets),
                r.target_speedup,
                reached,
            ]
        )
    title = f"Seconds per tick and to target at the named interconnects ({pi.label})"
    return Table(f"network_links_{pi.pair}_{pi.source}", title, columns, rows)


def crossover_table(result: NetworkResult) -> Table:
    pi = result.inputs
    title = f"Crossover bandwidth: where the method stops paying ({pi.label})"
    columns = ["overlap", "crossover (Gbit/s)", "reading"]
    key = f"network_crossover_{pi.pair}_{pi.source}"
    if not result.crossovers:
        return Table(key, title, columns, [], f"{title}: needs compute times per tick ({pi.compute_note})")
    rows: list[list[Cell]] = [[BOUNDS[o], x.gbps, x.describe()] for o, x in result.crossovers.items()]
    return Table(key, title, columns, rows)
