"""From bytes to seconds for one pair: tick times at each link, the crossover bandwidth, time to target.

Per seed ``s`` and link: the mean tick time ``T_bar_s = (1/n) sum_t T_s(t)`` and the time to target
(``commrl.netmodel.target``); over seeds, the mean and its interval (``commrl.report.stats``: t below 20
seeds, BCa from 20; a time's interval cut at 0 s, ``seconds_interval``) and the speed-up
``mean(dense) / mean(compressed)`` (Fieller's interval, paired by seed when both conditions have the same
seeds). A seed that never reaches the target is counted as such and left out of the interval. Analytic
inputs are one deterministic schedule shared by every validated seed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from commrl.netmodel.cost import Crossover, crossover_bandwidth
from commrl.netmodel.inputs import TickInputs
from commrl.netmodel.links import Layout, Link, NetModelError, finite_number, invalid
from commrl.netmodel.target import Reach, Target, dense_target, first_reach, time_to_target
from commrl.report.runs import Series
from commrl.report.stats import Interval, cut_below, mean_interval, ratio_interval

DENSE = "dense"
ANALYTIC_SEED = "analytic"  # the seed key of analytic inputs: one schedule for every validated seed
BOUNDS = {False: "no overlap", True: "full overlap"}
CUT_AT_ZERO = "cut at 0 s"  # the note of a seconds interval whose lower end fell below 0 (seconds_interval)


def seconds_interval(values: Iterable[float]) -> Interval:
    """The seed mean of a time in seconds and its 95% interval, ``mean_interval`` (Student t below 20 seeds,
    BCa from 20, as the report's captions say), with a lower end below 0 raised to 0.

    A time is never negative, so the mean ``mu`` of a condition's seconds lies in ``[0, inf)``; the
    t-interval ``x_bar -+ t s / sqrt(n)`` ignores that and, with few seeds and a wide spread, reaches below 0
    (e.g. 2 seeds at 10 s and 200 s: ``105 -+ 12.71 x 95`` s). Its intersection with ``[0, inf)`` has the
    same coverage, ``P(mu in [max(L, 0), U]) = P(mu in [L, U])`` because ``mu >= 0`` always, so the cut
    interval is still a 95% interval of the same mean, only without impossible values; the estimate (the
    bars) and the method stay those of the captions. (A t-interval on log seconds would also stay above 0,
    but it is an interval of the geometric mean, not of the mean the bars show.) BCa never needs the cut:
    its ends are quantiles of bootstrap means of non-negative seconds. The cut interval is not symmetric
    (it reads ``mean [0, high]``) and its ``note`` says ``cut at 0 s`` with the lower end it replaced."""
    note = f"{CUT_AT_ZERO} (the t-interval's lower end was {{low:.4g}} s; a time is >= 0)"
    return cut_below(mean_interval(values), 0.0, note)


@dataclass(frozen=True)
class Sweep:
    """The bandwidth sweep of the figure and the crossover: ``[low_gbps, high_gbps]`` at ``latency_us``;
    the method pays where it saves at least ``tolerance`` of dense's tick time."""

    low_gbps: float = 0.1
    high_gbps: float = 400.0
    latency_us: float = 5.0
    tolerance: float = 0.01

    def __post_init__(self) -> None:
        for key in ("low_gbps", "high_gbps"):
            value = getattr(self, key)
            if not finite_number(value) or value <= 0:
                raise invalid(f"sweep.{key}", value, "a finite bandwidth > 0 Gbit/s", "e.g. 0.1 or 400")
        if not finite_number(self.latency_us) or self.latency_us < 0:
            raise invalid("sweep.latency_us", self.latency_us, "a finite latency >= 0 us/message", "e.g. 5")
        if not self.low_gbps < self.high_gbps:
            raise NetModelError(
                "sweep.high_gbps",
                f"sweep.high_gbps={self.high_gbps!r} must exceed sweep.low_gbps={self.low_gbps!r}",
            )
        if not finite_number(self.tolerance) or not 0 <= self.tolerance < 1:
            raise NetModelError("sweep.tolerance", f"sweep.tolerance={self.tolerance!r} must be in [0, 1)")

    def bandwidths(self, n: int = 120) -> np.ndarray:
        return np.geomspace(self.low_gbps, self.high_gbps, n)

    def link(self, gbps: float) -> Link:
        return Link(f"{gbps:g} Gbit/s", gbps, self.latency_us, "sweep")


@dataclass(frozen=True)
class PairInputs:
    """Everything the model needs about a pair: per condition and seed the tick inputs, per condition and
    seed ``val/acc``, the layout, where bytes and compute come from (``source``: ``runs`` or ``analytic``;
    ``compute_note`` says what the compute times are) and notes."""

    pair: str
    source: str
    layout: Layout
    compressed: str
    ticks: Mapping[str, Mapping[str, TickInputs]]
    val: Mapping[str, Mapping[str, Series]]
    compute_known: bool
    compute_note: str
    notes: tuple[str, ...] = ()
    read_at: int | None = None  # the runs' read tick, where the target reads dense's val/acc

    @property
    def conditions(self) -> tuple[str, str]:
        return DENSE, self.compressed

    @property
    def label(self) -> str:
        return f"{self.pair} ({'tracked runs' if self.source == 'runs' else 'analytic ledger'})"

    def tick_inputs(self, condition: str, seed: str) -> TickInputs | None:
        """The seed's inputs; with analytic inputs, the one schedule of the condition."""
        per = self.ticks.get(condition, {})
        return per.get(seed, per.get(ANALYTIC_SEED))

    def with_train_s(self, seconds: float) -> PairInputs:
        """The same bytes with ``train_s = seconds`` and no sampling at every tick of both conditions."""
        ticks = {
            c: {
                s: replace(t, train_s=np.full(len(t), seconds), sample_s=np.zeros(len(t)))
                for s, t in per.items()
            }
            for c, per in self.ticks.items()
        }
        return replace(self, ticks=ticks, compute_known=True)


def seed_means(pi: PairInputs, condition: str, link: Link, overlap: bool | None) -> dict[str, float]:
    """``seed -> (1/n) sum_t T_s(t)``; ``overlap=None`` gives the communication time alone."""
    out = {}
    for seed, inputs in pi.ticks.get(condition, {}).items():
        comm = inputs.comm(pi.layout, link).total
        values = comm if overlap is None else inputs.tick_times(pi.layout, link, overlap)
        out[seed] = float(np.mean(values))
    return out


def seed_mean(pi: PairInputs, condition: str, link: Link, overlap: bool | None) -> float:
    """``(1/|S|) sum_s T_bar_s``: the seed mean of ``seed_means``."""
    return float(np.mean(list(seed_means(pi, condition, link, overlap).values())))


def mean_curve(
    pi: PairInputs, condition: str, sweep: Sweep, overlap: bool | None, n: int = 120
) -> np.ndarray:
    """``seed_mean`` at each bandwidth of ``sweep.bandwidths(n)``."""
    return np.array([seed_mean(pi, condition, sweep.link(b), overlap) for b in sweep.bandwidths(n)])


def crossover(pi: PairInputs, sweep: Sweep, overlap: bool) -> Crossover:
    """``crossover_bandwidth`` of the seed means of the two conditions' mean tick times."""

    def at(condition: str) -> Callable[[float], float]:
        return lambda gbps: seed_mean(pi, condition, sweep.link(gbps), overlap)

    return crossover_bandwidth(at(DENSE), at(pi.compressed), sweep.low_gbps, sweep.high_gbps, sweep.tolerance)


@dataclass(frozen=True)
class TargetTimes:
    """One condition at one link and bound: each validated seed's ``Reach``."""

    condition: str
    reaches: dict[str, Reach]

    @property
    def seconds(self) -> dict[str, float]:
        """``seed -> seconds`` of the seeds that reached the target."""
        return {s: r.seconds for s, r in self.reaches.items() if r.seconds is not None}

    @property
    def never(self) -> list[str]:
        return [s for s, r in self.reaches.items() if not r.reached]

    def interval(self) -> Interval | None:
        """The seed mean and interval of the seconds to target over the seeds that reached it
        (``seconds_interval``: cut at 0 s)."""
        seconds = list(self.seconds.values())
        return seconds_interval(seconds) if seconds else None

    def reached_text(self) -> str:
        return f"{len(self.seconds)}/{len(self.reaches)}"


def times_to_target(pi: PairInputs, condition: str, link: Link, overlap: bool, target: Target) -> TargetTimes:
    reaches = {}
    for seed, val in pi.val.get(condition, {}).items():
        inputs = pi.tick_inputs(condition, seed)
        if inputs is None:
            continue
        tick_s = inputs.tick_times(pi.layout, link, overlap)
        reaches[seed] = time_to_target(val, inputs.steps, tick_s, target.accuracy)
    return TargetTimes(condition, reaches)


def _speedup(dense: Mapping[str, float], compressed: Mapping[str, float]) -> Interval | None:
    """``mean(dense) / mean(compressed)`` over seeds (``ratio_interval`` of times: cut at 0); None when a
    side is empty."""
    return ratio_interval(dense, compressed, nonnegative=True) if dense and compressed else None


def _target_speedup(dense: TargetTimes, compressed: TargetTimes) -> Interval | None:
    """``_speedup`` of the times to target, given only when every timed seed of both conditions reached the
    target: a mean over the seeds that did would favour the condition that misses it more often."""
    if dense.never or compressed.never:
        return None
    return _speedup(dense.seconds, compressed.seconds)


@dataclass(frozen=True)
class LinkRow:
    """One link and bound: per condition the mean tick and communication seconds over seeds, the tick
    speed-up, the time to target per condition and its speed-up (None without validations or compute)."""

    link: Link
    overlap: bool
    tick: dict[str, Interval]
    comm: dict[str, Interval]
    tick_speedup: Interval | None
    target: dict[str, TargetTimes]
    target_speedup: Interval | None


def _cut_at_zero(rows: Sequence[LinkRow]) -> list[str]:
    """``<condition> <what> at <links>`` for the intervals of ``rows`` that ``seconds_interval`` cut at
    0 s, each link with its bounds (``both bounds`` when both; the communication time is the same under
    both bounds and named once per link)."""
    found: dict[tuple[str, str], dict[str, list[str]]] = {}
    for r in rows:
        cells = {"tick time": r.tick, "seconds to target": {c: t.interval() for c, t in r.target.items()}}
        if not r.overlap:
            cells = {"communication time": r.comm, **cells}
        for what, per in cells.items():
            for condition, interval in per.items():
                if interval is not None and interval.note.startswith(CUT_AT_ZERO):
                    bounds = found.setdefault((condition, what), {}).setdefault(r.link.name, [])
                    bounds += [] if what == "communication time" else [BOUNDS[r.overlap]]

    def at(bounds: list[str]) -> str:
        return "" if not bounds else " (both bounds)" if len(bounds) == 2 else f" ({bounds[0]})"

    out = []
    for (condition, what), links in found.items():
        labels = {at(b) for b in links.values()}
        if len(labels) == 1:
            out.append(f"{condition} {what} at {', '.join(links)}{labels.pop()}")
        else:
            out.append(f"{condition} {what} at {', '.join(f'{k}{at(b)}' for k, b in links.items())}")
    return out


@dataclass(frozen=True)
class NetworkResult:
    inputs: PairInputs
    sweep: Sweep
    rows: tuple[LinkRow, ...]
    target: Target | None
    crossovers: dict[bool, Crossover]
    notes: tuple[str, ...] = field(default=())


def evaluate(pi: PairInputs, links: Sequence[Link], sweep: Sweep, target_fraction: float) -> NetworkResult:
    """Every link x bound, the crossover of each bound (with known compute) and the target."""
    notes = list(pi.notes)
    missing = [c for c in pi.conditions if not pi.ticks.get(c)]
    if missing:
        raise NetModelError(
            "conditions",
            f"pair {pi.pair}: no tick inputs (comm/* and time/*) for {', '.join(missing)}; the model "
            f"compares {DENSE} with {pi.compressed}",
        )
    target = None
    if not pi.compute_known:
        notes.append(f"{pi.label}: {pi.compute_note}")
    elif pi.val.get(DENSE):
        target = dense_target(pi.val[DENSE], target_fraction, pi.read_at)
    else:
        notes.append(f"{pi.label}: no tracked val/acc of {DENSE}: no time to target")
    rows = []
    for link in links:
        comm = {c: seconds_interval(seed_means(pi, c, link, None).values()) for c in pi.conditions}
        for overlap in (False, True):
            means = {c: seed_means(pi, c, link, overlap) for c in pi.conditions}
            tick = {c: seconds_interval(m.values()) for c, m in means.items()} if pi.compute_known else {}
            targets = (
                {c: times_to_target(pi, c, link, overlap, target) for c in pi.conditions} if target else {}
            )
            rows.append(
                LinkRow(
                    link,
                    overlap,
                    tick,
                    comm,
                    _speedup(means[DENSE], means[pi.compressed]) if pi.compute_known else None,
                    targets,
                    _target_speedup(targets[DENSE], targets[pi.compressed]) if targets else None,
                )
            )
    crossovers = {o: crossover(pi, sweep, o) for o in (False, True)} if pi.compute_known else {}
    cut = _cut_at_zero(rows)
    if cut:
        notes.append(
            f"{pi.label}: 95% t-intervals of seconds cut at 0 s, the least a time can be (the cut keeps "
            f"their coverage; commrl.netmodel.analysis.seconds_interval): {'; '.join(cut)}"
        )
    if target:
        for condition in pi.conditions:
            vals = pi.val.get(condition, {})
            never = [s for s, v in vals.items() if first_reach(v, target.accuracy) is None]
            if never:
                seeds = ", ".join(never)
                notes.append(
                    f"{pi.label}: {condition} seed(s) {seeds} never reach {target.describe()}: no speed-up "
                    "to target (a mean over the seeds that reach it would favour the condition that misses "
                    "it more often)"
                )
            untimed = [s for s in vals if pi.tick_inputs(condition, s) is None]
            if untimed:
                seeds = ", ".join(untimed)
                notes.append(f"{pi.label}: {condition} seed(s) {seeds} have val/acc but no tick inputs")
    return NetworkResult(pi, sweep, tuple(rows), target, crossovers, tuple(dict.fromkeys(notes)))
