"""Grid studies: every point of ``grid`` trained once, from Optuna's trial queue, with a dense baseline.

A grid config (``sampler: {name: grid}``) lists values per axis: the method knobs, ``prompts_per_tick``
and the training ``seed``. ``commrl sweep init`` enqueues every point (seed-major, so a partial study holds
whole seeds); workers pop them from the shared storage, where taking a WAITING trial is atomic. The budget
is the grid's size, counted as for a search (``budget``). A killed trial is failed by the heartbeat reaper
and retried with the same point (its folder and MLflow run resume); a finished point is never queued again.

Optuna's ``GridSampler`` is not used: it hands out points by trial number and, once those run out, by a
random pick among the points it has not seen finish; with workers sharing a storage and retries taking new
trial numbers, two workers can draw the same point (Optuna documents this), which with the budget at the
grid's size leaves another point never trained. The queue cannot: a point is stored with its trial from the
moment it is enqueued, so ``claim_point`` can tell which of two trials holding it is the one that runs.

``baseline`` (e.g. ``dense``) adds a companion study, ``<study>-<baseline>``: that condition at every
(``prompts_per_tick``, ``seed``) of the grid (the method knobs do not apply to it), so that every cell's
method - dense difference is paired by seed at the same prompts. It is its own Optuna study and MLflow
parent; ``grid_studies`` lists both, baseline first (it is small and every cell needs it).
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from commrl.sweep.budget import BudgetFilled
from commrl.sweep.config import SweepConfig
from commrl.sweep.space import GridSpace
from commrl.sweep.storage import retry_history

# a trial in one of these states holds its point: no other trial may train it
HOLDING = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)
GRID_SOURCE = "grid"


class PointTaken(BudgetFilled):
    """A trial that must not train: its grid point is held by an earlier trial, or it has none (a trial
    Optuna created because the queue ran dry). It ends FAIL at once, like a surplus trial."""


def grid_studies(cfg: SweepConfig, name: str) -> list[tuple[SweepConfig, str]]:
    """The studies of a config and their names: a grid's baseline study first, then the study itself."""
    baseline = cfg.baseline_config()
    if baseline is None:
        return [(cfg, name)]
    return [(baseline, baseline_study_name(name, cfg)), (cfg, name)]


def baseline_study_name(name: str, cfg: SweepConfig) -> str:
    return f"{name}-{cfg.baseline}"


def point_of(trial: FrozenTrial) -> dict[str, Any] | None:
    """The grid point of a trial: its queued values (set when enqueued, kept by retries); None for a trial
    that was not queued."""
    return trial.system_attrs.get("fixed_params")


def _key(point: dict[str, Any]) -> tuple:
    return tuple(sorted(point.items()))


def enqueue_missing(study: optuna.Study, grid: GridSpace) -> list[dict[str, Any]]:
    """Enqueue, in grid order, every point no trial holds (first call: all of them); returns those points."""
    trials = study.get_trials(deepcopy=False, states=HOLDING)
    held = {_key(point) for point in map(point_of, trials) if point is not None}
    missing = [p for p in grid.points() if _key(p) not in held]
    for point in missing:
        study.enqueue_trial(point, user_attrs={"source": GRID_SOURCE})
    return missing


def claim_point(trial: optuna.Trial, frozen: FrozenTrial, trials: list[FrozenTrial], grid: GridSpace) -> None:
    """Let ``trial`` train only if it is the first holder of a queued grid point; else raise ``PointTaken``.

    Two trials can hold one point when two workers refill the queue at once; the lower-numbered one runs
    (workers pop the queue in number order). A RUNNING trial that this one retries holds its point no more:
    its retry was queued as it stopped (a preemption before its tell, a reaper before it fails a dead trial).
    A trial with no queued point refills the queue and ends.
    """
    point = point_of(frozen)
    if point is None:
        added = enqueue_missing(trial.study, grid)
        note = f"not a queued grid point; {len(added)} missing point(s) queued again"
    else:
        replaced = set(retry_history(frozen))
        holder = next(
            (
                t
                for t in trials
                if t.number < frozen.number
                and t.state in HOLDING
                and point_of(t) == point
                and not (t.number in replaced and t.state == TrialState.RUNNING)
            ),
            None,
        )
        if holder is None:
            return
        note = f"grid point {point} is held by trial {holder.number} ({holder.state.name})"
    trial.set_user_attr("note", note)
    raise PointTaken(note)
