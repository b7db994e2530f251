"""A study's best trial, one rule for every reader: the sweep's summary (Optuna's trials) and the report's
Sweeps table (their MLflow runs, tag ``optuna.trial``).

The best value in the study's direction; on an exact tie the lowest trial number, the point the study asked
for first (a retried trial gets a new number). The tied trials are named beside it, as the pick among them
says nothing about which point is better.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def best_trial(
    trials: Iterable[T],
    value: Callable[[T], float | None],
    number: Callable[[T], int],
    direction: str = "maximize",
) -> T | None:
    """The trial with the best ``value`` (``maximize`` or ``minimize``), the lowest ``number`` among exact
    ties; None when no trial has a value."""
    done = [t for t in trials if value(t) is not None]
    if not done:
        return None
    sign = 1.0 if direction == "minimize" else -1.0
    return min(done, key=lambda t: (sign * value(t), number(t)))


def tied_with(trials: Iterable[T], best: T, value: Callable[[T], float | None]) -> list[T]:
    """The other trials whose value equals ``best``'s exactly."""
    return [t for t in trials if t is not best and value(t) is not None and value(t) == value(best)]
