"""The trial budget of a study, counted by the workers themselves.

``MaxTrialsCallback`` only checks after a trial ends, so a worker restarted on a finished study still
runs one more trial, and it ignores trials other workers are running. Here the budget is the number of
COMPLETE + PRUNED + RUNNING trials, a trial and its retries counting once (a live worker's trial reserves
its slot; a failed trial frees it, and its WAITING retry takes it back when picked up; a killed trial still
RUNNING and its running retry hold one slot). Two workers that ask at the same moment could both pass the
check, so each trial also checks its rank: the first ``n_trials`` budget trials by number run, a later one
is a surplus and ends FAIL at once, before it trains (``BudgetFilled``). A retry ranks as its original
trial, so the retry of a trial inside the budget is never a surplus (it resumes that trial's checkpoint),
even if a new trial was asked while the dead one waited for its retry (the budget then overshoots by one).
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from commrl.sweep.config import HeartbeatConfig
from commrl.sweep.heartbeat import reap_stale_trials
from commrl.sweep.storage import retry_history, retry_of

BUDGET_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
FINISHED_STATES = (TrialState.COMPLETE, TrialState.PRUNED)
SURPLUS_NOTE = "surplus: the budget was already used when this trial started"


class BudgetFilled(Exception):
    """A trial asked after the budget was used; it ends FAIL without training."""


def budget_used(study: optuna.Study) -> int:
    return len({original(t) for t in study.get_trials(deepcopy=False, states=BUDGET_STATES)})


def finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED_STATES))


def original(trial: FrozenTrial) -> int:
    """The first trial of ``trial``'s retry chain (its own number for a fresh trial): whose slot, folder and
    MLflow run it has."""
    return (retry_history(trial) or [trial.number])[0]


def is_surplus(trials: list[FrozenTrial], number: int, n_trials: int) -> bool:
    """Whether trial ``number`` comes after the first ``n_trials`` budget trials, each retry chain counted
    once and ranked by its original trial's number."""
    mine = original(next(t for t in trials if t.number == number))
    ahead = {original(t) for t in trials if t.state in BUDGET_STATES and original(t) < mine}
    return len(ahead) >= n_trials


def superseded(trials: list[FrozenTrial], trial: FrozenTrial) -> str | None:
    """Why retry ``trial`` must not train, or None: its predecessor finished after all (a reaper queued the
    retry of a late trial), or an earlier trial retries it too (two reapers queued one at the same moment)."""
    history = retry_history(trial)
    if not history:
        return None
    before = next(t for t in trials if t.number == history[-1])
    if before.state in FINISHED_STATES:
        return f"trial {before.number} ended {before.state.name}: no retry needed"
    first = retry_of(trials, before.number)
    if first is not None and first.number != trial.number:
        return f"trial {before.number} is retried by trial {first.number}"
    return None


class StopWhenBudgetUsed:
    """An ``optimize`` callback: reap stale trials, then stop this worker once the budget is used."""

    def __init__(self, n_trials: int, heartbeat: HeartbeatConfig):
        self.n_trials = n_trials
        self.heartbeat = heartbeat

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        reap_stale_trials(study, self.heartbeat)
        if budget_used(study) >= self.n_trials:
            study.stop()
