"""Per-condition curves (the seeds of a condition combined tick by tick, with a 95% band) and the per-seed
read-outs (value at the read tick, best, mean over ticks) that the tables and claims aggregate."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from commrl.report.runs import PairRuns, Series
from commrl.report.stats import mean_bands

T = TypeVar("T", float, tuple[int, float])


@dataclass(frozen=True)
class Curve:
    """A metric of one condition: per tick the seed mean, its 95% interval (``stats.mean_bands``; NaN where
    fewer than two seeds logged the tick) and the number of seeds that logged it; ``seeds`` in all."""

    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: np.ndarray
    seeds: int

    def __len__(self) -> int:
        return len(self.steps)


def aggregate(series: Sequence[Series]) -> Curve:
    """``mean_t = (1/|S_t|) sum_{s in S_t} y_s(t)``, ``S_t`` the seeds that logged a finite value at tick
    ``t`` (NaN and infinities count as not logged), with the interval of that mean over ``S_t``."""
    steps = np.unique(np.concatenate([s.steps for s in series])) if series else np.array([], dtype=np.int64)
    table = np.full((len(series), len(steps)), np.nan)
    for i, s in enumerate(series):
        table[i, np.searchsorted(steps, s.steps)] = s.values
    bands = mean_bands(table)
    return Curve(steps, bands.mean, bands.low, bands.high, bands.n, len(series))


def seed_series(runs: PairRuns, condition: str, metric: str) -> dict[str, Series]:
    """``seed -> series`` of ``metric`` for the seeds of ``condition`` that logged at least one tick of it."""
    found = {r.seed: r.metrics.get(metric) for r in runs.runs_of(condition)}
    return {seed: s for seed, s in found.items() if s is not None and len(s.steps)}


def condition_curve(runs: PairRuns, condition: str, metric: str, tick: int | None = None) -> Curve | None:
    """The curve of ``metric`` over the seeds of ``condition``, on the ticks ``<= tick`` (all of them when
    ``tick`` is None); None when no seed logged one of them."""
    series = [until(s, tick) for s in seed_series(runs, condition, metric).values()]
    series = [s for s in series if len(s.steps)]
    return aggregate(series) if series else None


def curves(
    runs: PairRuns, metric: str, conditions: Sequence[str], tick: int | None = None
) -> dict[str, Curve]:
    """``condition -> curve`` (ticks ``<= tick``; all when None) for the conditions that logged ``metric``
    there, in the given order."""
    found = {c: condition_curve(runs, c, metric, tick) for c in conditions}
    return {c: curve for c, curve in found.items() if curve is not None}


def last_tick(runs: PairRuns, metric: str, conditions: Sequence[str]) -> int | None:
    """The last tick at which a run of ``conditions`` logged ``metric``; None when none did."""
    ends = [int(s.steps[-1]) for c in conditions for s in seed_series(runs, c, metric).values()]
    return max(ends) if ends else None


def per_seed(series: Mapping[str, Series], readout: Callable[[Series], T | None]) -> dict[str, T]:
    """``seed -> readout(series)``, without the seeds whose read-out is None or not finite (a tuple's value):
    a NaN or an infinity counts as not logged, as in ``aggregate``'s bands."""
    out = {}
    for seed, s in series.items():
        value = readout(s)
        number = value[-1] if isinstance(value, tuple) else value
        if value is not None and math.isfinite(number):
            out[seed] = value
    return out


def value_at(s: Series, tick: int | None) -> tuple[int, float] | None:
    """``(t*, y(t*))``, ``t*`` the last logged tick ``<= tick`` (the last tick when ``tick`` is None)."""
    idx = np.nonzero(s.steps <= tick)[0] if tick is not None else np.arange(len(s.steps))
    if not len(idx):
        return None
    i = int(idx[-1])
    return int(s.steps[i]), float(s.values[i])


def until(s: Series, tick: int | None) -> Series:
    """The ticks ``<= tick`` of ``s`` (all of them when ``tick`` is None): a read-out's window."""
    if tick is None:
        return s
    keep = s.steps <= tick
    return Series(s.steps[keep], s.values[keep])


def windowed(readout: Callable[[Series], T | None], tick: int | None) -> Callable[[Series], T | None]:
    """``readout`` on the ticks ``<= tick`` of a series: a mean over ticks or a best value read on the
    window up to the read tick, whatever a run logged after it."""
    return lambda s: readout(until(s, tick))


def exact_at(s: Series, tick: int) -> float | None:
    """The value at exactly ``tick``; None when it was not logged."""
    hit = np.nonzero(s.steps == tick)[0]
    return float(s.values[hit[0]]) if len(hit) else None


def first(s: Series) -> tuple[int, float] | None:
    """``(t_0, y(t_0))``, the first logged tick (the base model's read of a validation curve)."""
    return (int(s.steps[0]), float(s.values[0])) if len(s.steps) else None


def gain_at(s: Series, tick: int | None) -> tuple[int, float] | None:
    """``(t*, y(t*) - y(t_0))``: ``value_at(s, tick)`` less the first logged value (a validation curve's gain
    over the base model at the read); None when nothing was logged at or before ``tick``."""
    at, base = value_at(s, tick), first(s)
    return None if at is None or base is None else (at[0], at[1] - base[1])


def start_mean(s: Series, n: int = 3) -> float | None:
    """The mean of the first ``n`` logged ticks (ticks 0..2 when logging starts at 0): the starting level."""
    values = s.values[:n]
    values = values[np.isfinite(values)]
    return float(values.mean()) if len(values) else None


def mean_over_ticks(s: Series) -> float | None:
    """``(1/T) sum_t y(t)`` over the logged ticks (NaN and infinities ignored); None when none is finite."""
    values = s.values[np.isfinite(s.values)]
    return float(values.mean()) if len(values) else None


def best(s: Series) -> tuple[int, float] | None:
    """``(t, max_t y(t))`` over the finite values, the earliest tick on a tie; None when none is finite."""
    finite = np.isfinite(s.values)
    if not finite.any():
        return None
    i = int(np.argmax(np.where(finite, s.values, -np.inf)))
    return int(s.steps[i]), float(s.values[i])


def last_common_tick(items: Sequence[Series]) -> int | None:
    """The last tick at which every series logged a finite value (None when they share none): a NaN or an
    infinity is not logged, as everywhere in the report, so no seed drops out of what is read there."""

    def logged(s: Series) -> set[int]:
        return set(s.steps[np.isfinite(s.values)].tolist())

    common = logged(items[0])
    for s in items[1:]:
        common &= logged(s)
    return max(common) if common else None
