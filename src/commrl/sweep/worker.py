"""A sweep worker: runs trials of an initialised study until its budget is used; rerun it to resume.

Start any number of workers (Snakemake jobs, Slurm jobs) on the same storage. Each one first reaps the
trials of dead workers (failed, then re-enqueued with the same params), then runs trials while
COMPLETE + PRUNED + RUNNING < ``n_trials``. When the rest of the budget is held by RUNNING trials, it
watches their heartbeats for two intervals: if one is silent (its worker died, perhaps a moment ago), it
waits for the grace period, reaps it and runs the retry, so that a rerun after a crash or a preemption
always finishes the study. A preemption request (SIGUSR1 / SIGTERM, ``commrl.run.preempt``) stops the
worker after the running trial's next tick: the trial checkpoints, its retry is queued at once with the
same params (unless its chain used its ``heartbeat.max_retry`` retries), and the worker raises ``Preempted``
(``commrl sweep worker`` exits 75).
"""

from __future__ import annotations

import os
import socket
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from tqdm.auto import tqdm

from commrl import tracking
from commrl.run import preempt
from commrl.sweep.budget import BudgetFilled, StopWhenBudgetUsed, budget_used, finished
from commrl.sweep.config import SweepConfig
from commrl.sweep.heartbeat import reap_stale_trials, silent_trials
from commrl.sweep.objective import LocalDriver, SweepObjective, TrialDriver
from commrl.sweep.study import PARENT_ATTR, open_study
from commrl.sweep.trial_config import check_trials


def default_driver(cfg: SweepConfig) -> TrialDriver:
    if cfg.driver == "verl":
        from commrl.sweep.verl_driver import VerlDriver

        return VerlDriver(cfg)
    return LocalDriver(cfg)


def run_worker(
    cfg: SweepConfig, study_name: str, worker: int, driver: TrialDriver | None = None
) -> dict[str, Any]:
    """Run trials until the study's budget is used; returns a record of what this worker did."""
    if driver is None:
        check_trials(cfg)
    study = open_study(cfg, study_name, worker)
    objective = SweepObjective(cfg, study_name, study.user_attrs[PARENT_ATTR], driver or default_driver(cfg))
    ran: list[int] = []
    reaped: list[int] = []
    bar = tqdm(
        total=cfg.n_trials,
        initial=min(finished(study), cfg.n_trials),
        desc=f"{study_name} worker{worker}",
        unit="trial",
        disable=os.environ.get("COMMRL_NO_PROGRESS") == "1",
    )

    def record(study: optuna.Study, trial: FrozenTrial) -> None:
        ran.append(trial.number)
        bar.n = min(finished(study), cfg.n_trials)
        bar.refresh()
        if preempt.requested():
            study.stop()

    try:
        while True:
            if preempt.requested():  # between trials: nothing to save, the next worker takes the rest
                raise preempt.Preempted(None, preempt.received())
            reaped += reap_stale_trials(study, cfg.heartbeat)
            if finished(study) >= cfg.n_trials:
                break
            if budget_used(study) < cfg.n_trials:
                study.optimize(
                    objective,
                    catch=(BudgetFilled,),
                    gc_after_trial=True,
                    callbacks=[record, StopWhenBudgetUsed(cfg.n_trials, cfg.heartbeat)],
                )
                continue
            if not silent_trials(study, cfg.heartbeat):
                break  # live workers hold the rest of the budget and will finish it
    finally:
        bar.close()
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    return {
        "study": study_name,
        "worker": worker,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "tracking_uri": tracking.default_tracking_uri(),
        "n_trials": cfg.n_trials,
        "finished": finished(study),
        "study_complete": finished(study) >= cfg.n_trials,
        "reaped": reaped,
        "trials": [
            {
                "number": n,
                "state": trials[n].state.name,
                "value": trials[n].value,
                "params": trials[n].params,
                "note": trials[n].user_attrs.get("note"),
            }
            for n in ran
        ],
    }
