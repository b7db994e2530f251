"""The trial budget of a study, counted by the workers themselves.

``MaxTrialsCallback`` only checks after a trial ends, so a worker restarted on a finished study still
runs one more trial, and it ignores trials other workers are running. Here the budget is the number of
COMPLETE + PRUNED + RUNNING trials (a live worker's trial reserves its slot; a failed trial frees it, and
its WAITING retry takes it back when picked up). Two workers that ask at the same moment could both pass
the check, so each trial also checks its rank: the first ``n_trials`` budget trials by number run, a later
one is a surplus and ends FAIL at once, before it trains (``BudgetFilled``).
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from commrl.sweep.config import HeartbeatConfig
from commrl.sweep.heartbeat import reap_stale_trials

BUDGET_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
FINISHED_STATES = (TrialState.COMPLETE, TrialState.PRUNED)
SURPLUS_NOTE = "surplus: the budget was already used when this trial started"


class BudgetFilled(Exception):
    """A trial asked after the budget was used; it ends FAIL without training."""


def budget_used(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=BUDGET_STATES))


def finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED_STATES))


def is_surplus(trials: list[FrozenTrial], number: int, n_trials: int) -> bool:
    """Whether trial ``number`` comes after the first ``n_trials`` budget trials (by trial number)."""
    ahead = sum(1 for t in trials if t.number < number and t.state in BUDGET_STATES)
    return ahead >= n_trials


class StopWhenBudgetUsed:
    """An ``optimize`` callback: reap stale trials, then stop this worker once the budget is used."""

    def __init__(self, n_trials: int, heartbeat: HeartbeatConfig):
        self.n_trials = n_trials
        self.heartbeat = heartbeat

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        reap_stale_trials(study, self.heartbeat)
        if budget_used(study) >= self.n_trials:
            study.stop()
