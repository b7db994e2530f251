"""The note's figures (method.md §6) from one pair's runs, one function per figure, PNG on the Agg canvas.

Each function returns a ``FigureResult``; a figure whose metric no condition logged is not drawn and
carries the note that says so ("Figure 6 skipped (A): no runs with actor/kl_loss for conditions ...").
Every condition that logged the metric is drawn; the note's conditions that are missing are named.
Curves: the seed mean per tick with its 95% interval as a band (``curves.aggregate``); one seed, the line
alone; drawn up to the read tick (``PairRuns.read_at``) but for the KL figure, which draws the whole run.
Bars: the seed mean with its 95% interval as a whisker. Captions name the seeds per condition.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from commrl.report import curves as cv
from commrl.report.runs import PairRuns
from commrl.report.stats import MIN_BOOTSTRAP_N, Interval, mean_interval
from commrl.report.style import ASYNC_CONDITIONS, benchmark_label, format_interval, order_conditions
from commrl.report.tables import eval_scores

TICK_LABEL = "tick (optimizer step)"
DPI = 110
RANGE_CAPTION = (
    "With few seeds a Student t interval can reach past the metric's range (an accuracy or a KL below 0, a "
    "cosine above 1): such an end means a wide interval, not a value the metric took."
)
BAND_CAPTION = (
    "Lines: the mean over seeds per tick; bands: its 95% confidence interval over the seeds that logged the "
    f"tick (Student t below {MIN_BOOTSTRAP_N} seeds, BCa bootstrap from {MIN_BOOTSTRAP_N}); a condition "
    f"with one seed is the line alone. {RANGE_CAPTION}"
)
BAR_CAPTION = (
    "Bars: the mean over seeds; whiskers: its 95% confidence interval (Student t below "
    f"{MIN_BOOTSTRAP_N} seeds, BCa bootstrap from {MIN_BOOTSTRAP_N}; none with one seed). {RANGE_CAPTION}"
)


@dataclass(frozen=True)
class FigureResult:
    file: str
    pair: str
    number: int
    title: str
    caption: str
    drawn: bool
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {
            "file": self.file,
            "pair": self.pair,
            "number": self.number,
            "title": self.title,
            "caption": self.caption,
            "drawn": self.drawn,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Panel:
    metric: str
    title: str
    ylabel: str
    log: bool = False
    markers: bool = False  # a marker at every logged tick (sparse reads such as val/acc)


def file_name(number: int, slug: str, pair: str) -> str:
    """``fig<NN>_<slug>_<pair>.png``, the pair made file-safe."""
    return f"fig{number:02d}_{slug}_{re.sub(r'[^A-Za-z0-9_.-]', '_', pair)}.png"


def _save(fig: Figure, path: Path) -> None:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI, format="png")


def plot_curve(
    ax: Axes, curve: cv.Curve, condition: str, colour: str, markers: bool, floor: float | None = None
) -> None:
    """The seed mean as a line and, where two or more seeds logged a tick, its interval as a band; on a log
    axis the band is cut at ``floor`` (the axis bottom) where its lower end is not positive."""
    marker = "o" if markers or len(curve) == 1 else None
    label = f"{condition} (n={curve.seeds})"
    ax.plot(curve.steps, curve.mean, color=colour, label=label, marker=marker, markersize=4, linewidth=1.4)
    banded = np.isfinite(curve.low)
    if banded.any():
        low = curve.low if floor is None else np.maximum(curve.low, floor)
        ax.fill_between(curve.steps, low, curve.high, where=banded, color=colour, alpha=0.2, linewidth=0)


def _log_floor(panel_curves: dict[str, cv.Curve]) -> float | None:
    """Half the smallest positive mean or band end of a log panel; None when nothing is positive."""
    values = np.concatenate([np.concatenate([c.mean, c.low]) for c in panel_curves.values()])
    positive = values[np.isfinite(values) & (values > 0)]
    return float(positive.min()) / 2 if len(positive) else None


def seeds_caption(seeds: Mapping[str, int], parts: Mapping[str, Mapping[str, int]] | None = None) -> str:
    """``Seeds: dense n=3, method n=3 (n=1 in 'sign agreement').``: each condition's seed count and, where a
    figure has parts (panels, benchmarks) with fewer seeds of it than ``seeds`` says, those parts."""
    text = []
    for condition, n in seeds.items():
        counts = {name: part[condition] for name, part in (parts or {}).items() if condition in part}
        fewer = [f"n={k} in '{name}'" for name, k in counts.items() if k < n]
        text.append(f"{condition} n={n}" + (f" ({', '.join(fewer)})" if fewer else ""))
    return "Seeds: " + ", ".join(text) + "."


def _no_data(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="0.4")


def _skipped(
    runs: PairRuns, file: str, number: int, title: str, caption: str, what: str, expected: Sequence[str]
) -> FigureResult:
    note = f"Figure {number} skipped ({runs.pair}): no runs with {what} for conditions {', '.join(expected)}"
    return FigureResult(file, runs.pair, number, title, caption, False, (note,))


def _missing_note(
    runs: PairRuns, number: int, what: str, expected: Sequence[str], present: set[str]
) -> list[str]:
    missing = ", ".join(c for c in expected if c not in present)
    if not missing:
        return []
    return [f"Figure {number} ({runs.pair}): no runs with {what} for {missing}; drawn without them"]


def window_caption(read: int | None, last: int | None, whole_run: bool) -> str:
    """What a curve figure draws of runs read at tick ``read`` whose last logged tick is ``last``: the
    ticks up to the read tick, or (``whole_run``) every tick, past the read tick where a run goes on."""
    if read is None or last is None:
        return ""
    if whole_run:
        if last <= read:
            return ""
        return (
            f"Every run is drawn to its last logged tick (up to tick {last}), past the read tick "
            f"(tick {read}, dotted) at which the tables and claims read the runs."
        )
    after = f"; the ticks logged after it (to tick {last}) are not drawn" if last > read else ""
    return f"Drawn up to the read tick (tick {read}, dotted){after}."


def log_floor_caption(floor: float) -> str:
    """The log panel's axis floor, where the band ends at or below 0 are drawn."""
    return (
        f"The log-scale panel starts at {floor:.3g} (half its smallest positive value); a band whose lower "
        "end is at or below 0 is drawn down to that floor: a band reaching the floor includes 0."
    )


def _lines(
    runs: PairRuns,
    colours: dict[str, str],
    out_dir: Path,
    *,
    number: int,
    slug: str,
    title: str,
    caption: str,
    panels: Sequence[Panel],
    expected: Sequence[str],
    markers: bool = False,
    only: Sequence[str] | None = None,
    whole_run: bool = False,
) -> FigureResult:
    """A figure of per-tick curves, one panel per metric, one line (and band) per condition (per condition
    of ``only`` when given), on the ticks up to the read tick (every tick with ``whole_run``)."""
    file = file_name(number, slug, runs.pair)
    present = runs.conditions()
    conditions = order_conditions(present if only is None else present & set(only))
    read = runs.read_at()
    window = None if whole_run else read
    found = [cv.curves(runs, p.metric, conditions, window) for p in panels]
    what = " or ".join(p.metric for p in panels)
    if not any(found):
        return _skipped(runs, file, number, title, caption, what, expected)
    notes = _missing_note(runs, number, what, expected, {c for f in found for c in f})
    fig = Figure(figsize=(5.5 * len(panels) + 1.5, 4.2), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    floors = []
    for ax, panel, panel_curves in zip(axes, panels, found, strict=True):
        floor = _log_floor(panel_curves) if panel.log and panel_curves else None
        for condition, curve in panel_curves.items():
            plot_curve(ax, curve, condition, colours[condition], markers or panel.markers, floor)
        ax.set(title=panel.title if len(panels) > 1 else "", xlabel=TICK_LABEL, ylabel=panel.ylabel)
        if not panel_curves:
            _no_data(ax)
            notes.append(
                f"Figure {number} ({runs.pair}): panel '{panel.title}' is empty, no runs with {panel.metric}"
            )
            continue
        if read is not None:
            ax.axvline(read, linestyle=":", color="0.4", linewidth=1, label=f"read at tick {read}")
        if floor is not None:
            ax.set_yscale("log")
            ax.set_ylim(bottom=floor)
            floors.append(floor)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"{title} (pair {runs.pair})")
    _save(fig, out_dir / file)
    seeds = {c: max(f[c].seeds for f in found if c in f) for c in conditions if any(c in f for f in found)}
    per_panel = {p.title: {c: f[c].seeds for c in f} for p, f in zip(panels, found, strict=True)}
    ends = [cv.last_tick(runs, p.metric, list(seeds)) for p in panels]
    last = max((e for e in ends if e is not None), default=None)
    extra = [window_caption(read, last, whole_run), *(log_floor_caption(f) for f in floors), BAND_CAPTION]
    caption = " ".join([caption, *(e for e in extra if e), seeds_caption(seeds, per_panel)])
    return FigureResult(file, runs.pair, number, title, caption, True, tuple(notes))


def score_figure(runs: PairRuns, colours: dict[str, str], out_dir: Path) -> FigureResult:
    return _lines(
        runs,
        colours,
        out_dir,
        number=2,
        slug="score",
        title="Group score per tick",
        caption="Mean verified accuracy of the sampled answers per tick (score/mean), no smoothing. The "
        "note's Figure 2 (pair A: dense, method, anchor off) and Figure 10 (pair B).",
        panels=[Panel("score/mean", "group score", "score (fraction correct)")],
        expected=("dense", "method", "anchor_off"),
    )


def validation_figure(runs: PairRuns, colours: dict[str, str], out_dir: Path) -> FigureResult:
    return _lines(
        runs,
        colours,
        out_dir,
        number=3,
        slug="val",
        title="Validation accuracy per read",
        caption="Held-out accuracy (val/acc) at tick 0 (the base model) and every val_every ticks. "
        "The note's Figure 3.",
        panels=[Panel("val/acc", "validation accuracy", "accuracy (fraction)")],
        expected=("dense", "method"),
        markers=True,
    )


def mismatch_figure(runs: PairRuns, colours: dict[str, str], out_dir: Path) -> FigureResult:
    return _lines(
        runs,
        colours,
        out_dir,
        number=5,
        slug="mismatch",
        title="Sampler/trainer mismatch",
        caption="Left: Pearson correlation of sampler and trainer log-probs on the response tokens. Right: "
        "mean |p_sampler - p_trainer| at sampled tokens, log scale. The note's Figure 5.",
        panels=[
            Panel("mismatch/logprob_corr", "log-prob correlation", "Pearson correlation"),
            Panel(
                "mismatch/prob_gap",
                "probability gap (log scale)",
                "mean |p_sampler - p_trainer| (probability)",
                log=True,
            ),
        ],
        expected=("dense", "method"),
    )


def kl_figure(runs: PairRuns, colours: dict[str, str], out_dir: Path) -> FigureResult:
    return _lines(
        runs,
        colours,
        out_dir,
        number=6,
        slug="kl",
        title="KL to the reference policy per tick",
        caption="actor/kl_loss per tick, every logged tick, linear scale. The note's Figure 6 (dense, "
        "method, dropout, prf_mask to tick 150).",
        panels=[Panel("actor/kl_loss", "KL(pi_theta || pi_ref)", "KL (nats)")],
        expected=("dense", "method", "dropout", "prf_mask"),
        whole_run=True,
    )


def async_clip_figure(runs: PairRuns, colours: dict[str, str], out_dir: Path) -> FigureResult:
    return _lines(
        runs,
        colours,
        out_dir,
        number=8,
        slug="async_clip",
        title="What an asynchronous trainer would clip",
        caption="Fraction of response tokens whose ratio pi_trainer / pi_sampler leaves [0.8, 1.2] (left) "
        "and [0.2, 5] (right). The note's Figure 8.",
        panels=[
            Panel("mismatch/async_clip_frac_eps0.2", "clip at eps = 0.2", "fraction of tokens"),
            Panel("mismatch/async_clip_frac_5x", "clip at 5x", "fraction of tokens"),
        ],
        expected=("dense", "method"),
    )


def clip_figure(runs: PairRuns, colours: dict[str, str], out_dir: Path) -> FigureResult:
    return _lines(
        runs,
        colours,
        out_dir,
        number=9,
        slug="clip",
        title="PPO clipping inside the update",
        caption="Left: fraction of tokens at the clip boundary (actor/pg_clipfrac). Right: within-update "
        "off-policy KL (actor/ppo_kl). Both on the ticks the anchor did not fire (every tick of a run "
        "without one): a fire's replay is the ratio-one dense update, where both are 0. The note's Figure 9 "
        "(the method's run).",
        panels=[
            Panel("actor/pg_clipfrac", "pg_clipfrac", "fraction of tokens"),
            Panel("actor/ppo_kl", "ppo_kl", "KL (nats)"),
        ],
        expected=("method",),
    )


COSINE_RAW, COSINE_CORRECTED = "anchor/grad_cosine_raw", "anchor/grad_cosine_corrected"
DIAGNOSTICS_CAPTION = (
    "At the fire ticks that run it (method.grad_cosine_every: every fire, or the first at or after each "
    "multiple of that many ticks): cosine of the fast circuit's update with the dense gradient on the same "
    f"batch at the same weights, before ({COSINE_RAW}) and after ({COSINE_CORRECTED}) sign correction; at "
    "each fire tick, the share of activation energy the bases keep (codec/energy_captured); on fast ticks, "
    "the fraction of elements where sign(G_corr) = sign(M) (sign_memory/agreement: 1 by construction for "
    "alpha <= 0.5, where the correction leaves no element against M's sign; above 0.5 it can be lower, and "
    "at alpha = 1, no correction, it is the agreement of the codec's update itself). Not in the note "
    "(docs/method.md §4)."
)


def uncorrected(runs: PairRuns, tick: int | None) -> bool:
    """Whether every run that logged both cosines logged the same ones up to ``tick`` (all ticks when None):
    no sign correction acted (alpha = 1, or no memory yet), so the two cosine panels are the same."""
    both = [r.metrics for r in runs.train if COSINE_RAW in r.metrics and COSINE_CORRECTED in r.metrics]
    cut = [(cv.until(m[COSINE_RAW], tick), cv.until(m[COSINE_CORRECTED], tick)) for m in both]
    return bool(both) and all(
        np.array_equal(raw.steps, corr.steps) and np.array_equal(raw.values, corr.values, equal_nan=True)
        for raw, corr in cut
    )


def diagnostics_figure(runs: PairRuns, colours: dict[str, str], out_dir: Path) -> FigureResult:
    caption = DIAGNOSTICS_CAPTION
    if uncorrected(runs, runs.read_at()):
        caption += (
            f" No sign correction in these runs ({COSINE_CORRECTED} equals {COSINE_RAW} in every run that "
            "logged both): the two cosine panels are the same."
        )
    return _lines(
        runs,
        colours,
        out_dir,
        number=15,  # the report's own: the note's Figure 11 is pair B's per-benchmark accuracy (Figure 4)
        slug="diagnostics",
        title="The fast circuit's diagnostics",
        caption=caption,
        panels=[
            Panel(COSINE_RAW, "cosine, before sign correction", "cos(update, G_dense)"),
            Panel(COSINE_CORRECTED, "cosine, after sign correction", "cos(update, G_dense)"),
            Panel("codec/energy_captured", "activation energy kept", "||AQ||^2 / ||A||^2"),
            Panel("sign_memory/agreement", "sign agreement with M", "fraction of elements"),
        ],
        expected=("method",),
        markers=True,
    )


def async_figure(runs: PairRuns, colours: dict[str, str], out_dir: Path) -> FigureResult:
    return _lines(
        runs,
        colours,
        out_dir,
        number=14,
        slug="async",
        title="Learning under asynchrony",
        caption="One-step-off-policy training (rl.staleness 1) and its rollout corrections. Left: held-out "
        "accuracy (val/acc) at each validation read. Right: fraction of the eligible response tokens (valid, "
        "nonzero advantage) whose policy-gradient loss still has a gradient after clipping and correction "
        "(actor/effective_token_frac), per tick the anchor did not fire (a fire's replay is the ratio-one "
        "dense update, which nothing clips). Not in the note: its open problem (§4.3), trained.",
        panels=[
            Panel("val/acc", "validation accuracy per read", "accuracy (fraction)", markers=True),
            Panel(
                "actor/effective_token_frac",
                "tokens carrying gradient (fast ticks)",
                "fraction of eligible tokens",
            ),
        ],
        expected=ASYNC_CONDITIONS,
        only=ASYNC_CONDITIONS,
    )


def whiskers(intervals: Sequence[Interval | None]) -> tuple[np.ndarray, np.ndarray]:
    """Bar heights (the estimates, NaN where None) and ``yerr`` rows ``[mean - low, high - mean]`` (0 where
    there is no interval)."""
    mean = np.array([np.nan if i is None else i.estimate for i in intervals])
    err = np.zeros((2, len(intervals)))
    for j, i in enumerate(intervals):
        if i is not None and i.low is not None and i.high is not None:
            err[:, j] = (i.estimate - i.low, i.high - i.estimate)
    return mean, err


def benchmark_figure(runs: PairRuns, colours: dict[str, str], out_dir: Path) -> FigureResult:
    """Grouped bars: one group per benchmark, one bar per condition (the seed mean, 95% CI whiskers)."""
    number, title = 4, "Accuracy per benchmark"
    caption = (
        "eval/BENCHMARK/acc of the evaluated checkpoints (mean@1 greedy, avg@8 sampled). The note's "
        f"Figure 4 (pair A) and Figure 11 (pair B). {BAR_CAPTION}"
    )
    file = file_name(number, "benchmarks", runs.pair)
    expected = ("dense", "method")
    scores = eval_scores(runs, "acc")
    if not scores:
        return _skipped(runs, file, number, title, caption, "eval/BENCHMARK/acc (kind=eval)", expected)
    conditions = order_conditions({c for per in scores.values() for c in per})
    notes = _missing_note(runs, number, "evaluation runs", expected, set(conditions))
    width_in = min(14.0, max(6.0, 0.25 * len(scores) * len(conditions) + 3))
    fig = Figure(figsize=(width_in, 4.5), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(scores))
    width = 0.8 / len(conditions)
    seeds = {}
    per_benchmark = {benchmark_label(b): {c: len(v) for c, v in per.items()} for b, per in scores.items()}
    for i, condition in enumerate(conditions):
        per = [scores[b].get(condition, []) for b in scores]
        mean, err = whiskers([mean_interval(v) if v else None for v in per])
        seeds[condition] = max(len(v) for v in per)
        ax.bar(
            x + (i - (len(conditions) - 1) / 2) * width,
            mean,
            width,
            color=colours[condition],
            label=f"{condition} (n={seeds[condition]})",
            yerr=err,
            capsize=2,
        )
    ax.set_xticks(x, [benchmark_label(b) for b in scores], rotation=25, ha="right")
    ax.set(ylabel="accuracy (fraction)", xlabel="benchmark", ylim=(0, 1.05))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"{title} (pair {runs.pair})")
    _save(fig, out_dir / file)
    caption += f" {seeds_caption(seeds, per_benchmark)}"
    return FigureResult(file, runs.pair, number, title, caption, True, tuple(notes))


def ticks_label(ticks: Sequence[int]) -> str:
    """``@ tick 40`` for one seed, ``@ ticks 0, 0, 40`` (one per seed, sorted) for more; a line ``(0 = base)``
    under it when a seed's best is its tick-0 read, the base model's."""
    ordered = sorted(ticks)
    label = f"@ tick{'s' if len(ordered) > 1 else ''} {', '.join(str(t) for t in ordered)}"
    return f"{label}\n(0 = base)" if 0 in ordered else label


def best_validation_figure(runs: PairRuns, colours: dict[str, str], out_dir: Path) -> FigureResult:
    """One bar per condition (its codec in the label): the seed mean of each seed's best val/acc over its
    whole run, as the note's Figure 7 reads it, 95% CI whisker, labelled with the tick of each seed's best."""
    number, title = 7, "Best validation accuracy per codec"
    read = runs.read_at()
    table = f" (tick {read})" if read is not None else ""
    caption = (
        "The best val/acc each seed reached over its whole run (every validation, also after the read "
        "tick), averaged over the seeds of each condition; the label gives the tick of each seed's best (0: "
        "the base model's read). The table 'Best validation accuracy' reads the best up to the read "
        f"tick{table} instead, and claim 11 the val/acc at it. The note's Figure 7. {BAR_CAPTION}"
    )
    file = file_name(number, "best_val", runs.pair)
    expected = ("method", "prf_mask")
    conditions = order_conditions(runs.conditions())
    best = {c: cv.per_seed(cv.seed_series(runs, c, "val/acc"), cv.best) for c in conditions}
    found = {c: b for c, b in best.items() if b}
    if not found:
        return _skipped(runs, file, number, title, caption, "val/acc", expected)
    notes = _missing_note(runs, number, "val/acc", expected, set(found))
    codec = {r.condition: r.codec for r in runs.train}
    intervals = [mean_interval(v for _, v in b.values()) for b in found.values()]
    ticks = [[t for t, _ in b.values()] for b in found.values()]
    fig = Figure(figsize=(max(5.0, 1.6 * len(found) + 2), 4.4), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(found))
    mean, err = whiskers(intervals)
    bars = ax.bar(x, mean, 0.6, color=[colours[c] for c in found], yerr=err, capsize=3)
    labels = [f"{format_interval(i, '.3f')}\n{ticks_label(t)}" for i, t in zip(intervals, ticks, strict=True)]
    ax.bar_label(bars, labels, fontsize="x-small", padding=2)
    ax.set_xticks(x, [f"{c}\n({codec.get(c) or 'codec ?'})" for c in found])
    ax.set(ylabel="best validation accuracy (fraction)", xlabel="condition (codec)", ylim=(0, 1.15))
    ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{title} (pair {runs.pair})")
    _save(fig, out_dir / file)
    caption += f" {seeds_caption({c: len(b) for c, b in found.items()})}"
    return FigureResult(file, runs.pair, number, title, caption, True, tuple(notes))


FigureFn = Callable[[PairRuns, dict[str, str], Path], FigureResult]
FIGURES: tuple[FigureFn, ...] = (
    score_figure,
    validation_figure,
    benchmark_figure,
    mismatch_figure,
    kl_figure,
    best_validation_figure,
    async_clip_figure,
    clip_figure,
    diagnostics_figure,
    async_figure,
)
