"""Time to a target validation accuracy: the first validation at or above the target, and the modelled
seconds of the ticks that led to it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from commrl.netmodel.links import NetModelError
from commrl.report.runs import Series


@dataclass(frozen=True)
class Target:
    """``accuracy = fraction * mean_s y_s``: a fraction of dense's ``val/acc`` at the read tick (each dense
    seed's last finite validation up to ``read_at``, or its last finite one without a read tick, averaged
    over its ``seeds``), the tick every claim and table reads."""

    accuracy: float
    fraction: float
    dense_final: float
    seeds: int
    read_at: int | None = None

    def describe(self) -> str:
        where = f"at the read tick {self.read_at}" if self.read_at is not None else "at its last validation"
        return (
            f"val/acc >= {self.accuracy:.4g} ({self.fraction:g} x dense's val/acc {where}, "
            f"{self.dense_final:.4g}, mean of {self.seeds} seed{'s' if self.seeds != 1 else ''})"
        )


def dense_target(dense_val: Mapping[str, Series], fraction: float, read_at: int | None = None) -> Target:
    """``target = fraction * (1/n) sum_s y_s(T_s)``, ``T_s`` dense seed ``s``'s last validated step with a
    finite value, up to ``read_at`` when given (a seed without one is left out)."""
    if not (0 < fraction <= 1):
        raise NetModelError("target_fraction", f"target_fraction={fraction!r} must be in (0, 1], e.g. 0.95")
    finals = []
    for s in dense_val.values():
        keep = np.isfinite(s.values) & (s.steps <= read_at if read_at is not None else True)
        if keep.any():
            finals.append(float(s.values[keep][-1]))
    if not finals:
        raise NetModelError("val/acc", "dense has no finite val/acc: the target needs dense's validation")
    final = float(np.mean(finals))
    return Target(fraction * final, fraction, final, len(finals), read_at)


def first_reach(val: Series, accuracy: float) -> int | None:
    """``s* = min {s : y(s) >= target}`` over the validated steps; None when no validation reaches it."""
    hit = np.nonzero(val.values >= accuracy)[0]
    return int(val.steps[hit[0]]) if len(hit) else None


def elapsed(steps: np.ndarray, tick_s: np.ndarray, until: int) -> float:
    """``E(s*) = sum_{1 <= s <= s*} T(s)`` when every tick ``1..s*`` is logged; when only ``k`` of them are,
    their mean stands in for the rest: ``E = (s* / k) sum_{logged s <= s*} T(s)``. ``E(0) = 0``."""
    if until <= 0:
        return 0.0
    logged = (steps >= 1) & (steps <= until)
    if not logged.any():
        raise NetModelError("steps", f"no tick logged at or before step {until}: cannot time it")
    return float(tick_s[logged].sum() * until / logged.sum())


@dataclass(frozen=True)
class Reach:
    """One seed: the step it first reached the target at and the modelled seconds to it (None: never)."""

    step: int | None
    seconds: float | None

    @property
    def reached(self) -> bool:
        return self.step is not None


def time_to_target(val: Series, steps: np.ndarray, tick_s: np.ndarray, accuracy: float) -> Reach:
    """``Reach(s*, E(s*))`` (``first_reach``, ``elapsed``); ``Reach(None, None)`` when never reached."""
    step = first_reach(val, accuracy)
    if step is None:
        return Reach(None, None)
    return Reach(step, elapsed(steps, tick_s, step))
