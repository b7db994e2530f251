"""Per-condition curves: the seeds of a condition combined tick by tick, and the read-outs taken from them."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from commrl.report.runs import PairRuns, Series


@dataclass(frozen=True)
class Curve:
    """A metric of one condition: at each tick the mean, min and max over the seeds that logged it."""

    steps: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    seeds: int

    def __len__(self) -> int:
        return len(self.steps)


def aggregate(series: Sequence[Series]) -> Curve:
    """``mean_t = (1/|S_t|) sum_{s in S_t} y_s(t)``, ``S_t`` the seeds that logged tick ``t``; NaN ignored."""
    steps = np.unique(np.concatenate([s.steps for s in series])) if series else np.array([], dtype=np.int64)
    table = np.full((len(series), len(steps)), np.nan)
    for i, s in enumerate(series):
        table[i, np.searchsorted(steps, s.steps)] = s.values
    with warnings.catch_warnings():  # all-NaN ticks give NaN, which is what is meant
        warnings.simplefilter("ignore", RuntimeWarning)
        return Curve(steps, np.nanmean(table, 0), np.nanmin(table, 0), np.nanmax(table, 0), len(series))


def condition_curve(runs: PairRuns, condition: str, metric: str) -> Curve | None:
    """The curve of ``metric`` over the seeds of ``condition``; None when no seed logged it."""
    series = [r.metrics[metric] for r in runs.runs_of(condition) if metric in r.metrics]
    series = [s for s in series if len(s.steps)]
    return aggregate(series) if series else None


def curves(runs: PairRuns, metric: str, conditions: Sequence[str]) -> dict[str, Curve]:
    """``condition -> curve`` for the conditions that logged ``metric``, in the given order."""
    found = {c: condition_curve(runs, c, metric) for c in conditions}
    return {c: curve for c, curve in found.items() if curve is not None}


def value_at(curve: Curve, tick: int | None) -> tuple[int, float] | None:
    """``(t*, mean(t*))``, ``t*`` the last logged tick ``<= tick`` (the last tick when ``tick`` is None)."""
    idx = np.nonzero(curve.steps <= tick)[0] if tick is not None else np.arange(len(curve))
    if not len(idx):
        return None
    i = int(idx[-1])
    return int(curve.steps[i]), float(curve.mean[i])


def exact_at(curve: Curve, tick: int) -> float | None:
    """The mean at exactly ``tick``; None when no seed logged it."""
    hit = np.nonzero(curve.steps == tick)[0]
    return float(curve.mean[hit[0]]) if len(hit) else None


def start_mean(curve: Curve, n: int = 3) -> float:
    """The mean of the first ``n`` logged ticks (ticks 0..2 when logging starts at 0): the starting level."""
    return float(np.nanmean(curve.mean[:n]))


def mean_over_ticks(curve: Curve) -> float:
    """``(1/T) sum_t mean(t)`` over the logged ticks (NaN ignored)."""
    values = curve.mean[~np.isnan(curve.mean)]
    return float(values.mean()) if len(values) else float("nan")


def best(curve: Curve) -> tuple[int, float] | None:
    """``(t, max_t mean(t))``, the earliest tick on a tie; None when every value is NaN."""
    if np.all(np.isnan(curve.mean)):
        return None
    i = int(np.nanargmax(curve.mean))
    return int(curve.steps[i]), float(curve.mean[i])


def last_common_tick(*items: Curve) -> int | None:
    """The last tick logged by every curve (None when they share none)."""
    common = set(items[0].steps.tolist())
    for curve in items[1:]:
        common &= set(curve.steps.tolist())
    return max(common) if common else None
