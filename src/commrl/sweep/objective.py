"""One Optuna trial = one training run through the project's own training code.

``SweepObjective`` turns a trial into a ``TrialPlan`` (params, folder, MLflow run spec), runs it through a
driver (``LocalDriver``: ``LocalTrainer`` in this process; ``verl_driver.VerlDriver``: the cluster driver
as a subprocess) and turns the outcome into Optuna's: the value is ``val/acc`` at ``read_at``; every
validation before it is reported, and a pruner's verdict or a collapse alarm (``health/alarm``) stops the
run through ``StopTraining``, which becomes ``optuna.TrialPruned`` (a grid study stops nothing: every point
is read at ``read_at``, alarm or not; ``commrl.sweep.grid``). A preempted trial (``preempt.Preempted``: it
checkpointed on SIGUSR1 / SIGTERM), an interrupted one or a crashed one (any error but a ``ConfigError``)
ends FAIL with its retry queued at once, same params, same folder (it resumes from its checkpoint), unless
its chain used its ``heartbeat.max_retry`` retries; the exception carries a note saying which. A trial has
one retry however many paths queue it (the preempt path, the heartbeat reaper): a retry that is not its
predecessor's first, or whose predecessor finished after all, ends FAIL at once (``budget.superseded``).
The trial's MLflow run is the trainer's, nested under the sweep's parent run; it ends FINISHED with tag
``optuna.state`` = COMPLETE or PRUNED.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from commrl import tracking
from commrl.errors import ConfigError
from commrl.rl.health import NonFiniteLossError
from commrl.run import preempt, record
from commrl.run.hooks import StopTraining, TrainCallbacks
from commrl.run.record import RunSpec
from commrl.run.summary import RunSummary
from commrl.sweep.budget import SURPLUS_NOTE, BudgetFilled, is_surplus, superseded
from commrl.sweep.config import SweepConfig
from commrl.sweep.grid import claim_point
from commrl.sweep.heartbeat import TrialHeartbeat
from commrl.sweep.storage import enqueue_retry, retry_history
from commrl.sweep.study import SweepError
from commrl.sweep.trial_config import local_overrides, trial_dir


@dataclass
class TrialPlan:
    """What a driver trains for one trial."""

    number: int  # this trial
    key: int  # the original trial of a retry chain: names the folder and the MLflow run
    params: dict[str, Any]
    out_dir: Path
    run: RunSpec


TrialDriver = Callable[[TrialPlan, TrainCallbacks], RunSummary]


class LocalDriver:
    """The local trainer (``commrl train``'s code) in this process."""

    def __init__(self, cfg: SweepConfig):
        self.cfg = cfg

    def __call__(self, plan: TrialPlan, hooks: TrainCallbacks) -> RunSummary:
        from commrl.rl.config import load_train_config
        from commrl.rl.trainer import LocalTrainer

        train_cfg = load_train_config(local_overrides(self.cfg, plan.params, plan.out_dir))
        return LocalTrainer(train_cfg, run=plan.run, callbacks=hooks).train()


class PruningHooks(TrainCallbacks):
    """Reports each validation to the trial; stops the run when the pruner says so or on a collapse alarm."""

    def __init__(
        self,
        trial: optuna.Trial,
        reported: dict[int, float],
        read_at: int,
        out_dir: Path,
        stop_on_alarm: bool = True,
    ):
        self.trial = trial
        self.reported = dict(reported)  # a retry inherits its predecessor's values
        self.read_at = read_at
        self.out_dir = out_dir
        self.stop_on_alarm = stop_on_alarm
        self.reason: str | None = None

    def report(self, step: int, accuracy: float) -> None:
        """Tick 0 is the base model, the same in every trial: reported, it would be every trial's best value
        so far and percentile pruners (median) would never stop anything."""
        if 0 < step <= self.read_at and step not in self.reported:
            self.trial.report(accuracy, step)
            self.reported[step] = accuracy

    def on_validation(self, step: int, accuracy: float) -> None:
        self.report(step, accuracy)
        if 0 < step < self.read_at and self.trial.should_prune():
            self.reason = f"pruned at tick {step} (val/acc {accuracy:.4f})"
            raise StopTraining(self.reason)

    def on_tick(self, step: int, metrics: dict[str, float]) -> None:
        if self.stop_on_alarm and metrics.get("health/alarm", 0.0) >= 1.0 and step < self.read_at:
            self.reason = f"collapse alarm at tick {step}"
            raise StopTraining(self.reason)

    def run_id(self) -> str | None:
        return record.written_run_id(self.out_dir)


def retry_note(number: int, queued: bool, max_retry: int) -> str:
    """What became of interrupted trial ``number``: queued again, or not (its retries used)."""
    if queued:
        return f"trial {number} re-enqueued with the same params"
    return f"trial {number} not re-enqueued: its retries reached heartbeat.max_retry={max_retry}"


class SweepObjective:
    """The function ``study.optimize`` calls: one trial, start to end."""

    def __init__(self, cfg: SweepConfig, study_name: str, parent_run_id: str, driver: TrialDriver):
        self.cfg = cfg
        self.study_name = study_name
        self.parent_run_id = parent_run_id
        self.driver = driver
        self.tracking_uri = tracking.default_tracking_uri()

    def __call__(self, trial: optuna.Trial) -> float:
        trials = trial.study.get_trials(deepcopy=False)
        if is_surplus(trials, trial.number, self.cfg.n_trials):
            trial.set_user_attr("note", SURPLUS_NOTE)
            raise BudgetFilled(SURPLUS_NOTE)
        frozen = self._frozen(trial, trials)
        void = superseded(trials, frozen)
        if void:
            trial.set_user_attr("note", void)
            raise BudgetFilled(void)
        if self.cfg.is_grid:
            claim_point(trial, frozen, trials, self.cfg.space)
        history = retry_history(frozen)
        key = history[0] if history else trial.number
        params = self.cfg.space.suggest(trial)
        out_dir = trial_dir(self.cfg, self.study_name, key)
        trial.set_user_attr("out_dir", str(out_dir))
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        if history:
            trial.set_user_attr("retry_of", key)
        plan = TrialPlan(trial.number, key, params, out_dir, self._run_spec(trial.number, key, params))
        hooks = PruningHooks(
            trial, frozen.intermediate_values, self.cfg.read_at, out_dir, stop_on_alarm=not self.cfg.is_grid
        )
        result: RunSummary | None = None
        with TrialHeartbeat(trial, self.cfg.heartbeat.interval):
            try:
                result = self.driver(plan, hooks)
            except StopTraining as stop:
                hooks.reason = hooks.reason or str(stop)
            except NonFiniteLossError as err:
                hooks.reason = f"diverged: {err}"
            except ConfigError:
                raise  # a bad setting fails the same way again: no retry
            except (KeyboardInterrupt, preempt.Preempted, Exception) as stop:
                # Preempted, interrupted or crashed (a verl child's non-zero exit: an NCCL timeout, a dead Ray
                # worker, out of memory): Optuna marks the trial FAIL and the worker exits with the error.
                # Queue its retry now, as the heartbeat reaper would for a dead worker, so that the next
                # worker resumes it (same params, its checkpoint, its MLflow run) within heartbeat.max_retry;
                # killed before that tell, the trial is reaped later and keeps this one retry
                queued = enqueue_retry(trial.study, self._frozen(trial), self.cfg.heartbeat)
                outcome = retry_note(trial.number, queued, self.cfg.heartbeat.max_retry)
                if isinstance(stop, (KeyboardInterrupt, preempt.Preempted)):
                    what = str(stop) or "interrupted"
                else:
                    what = f"crashed: {type(stop).__name__}: {stop}"
                trial.set_user_attr("note", f"{what}; {outcome}")
                stop.add_note(outcome)
                raise
        run_id = (result.mlflow_run_id if result else None) or hooks.run_id()
        if run_id:
            trial.set_user_attr("mlflow_run_id", run_id)
        if result is not None:
            for step, acc in sorted(result.val_acc.items()):
                hooks.report(step, acc)
            hooks.reason = hooks.reason or result.stopped_early
        if hooks.reason:
            trial.set_user_attr("note", hooks.reason)
            self._finish_run(run_id, trial.number, key, "PRUNED", hooks.reason)
            raise optuna.TrialPruned(hooks.reason)
        value = result.val_acc.get(self.cfg.read_at)
        if value is None:
            raise SweepError(
                f"trial {trial.number} trained {result.ticks_trained} of {result.ticks_asked} ticks and "
                f"has no val/acc at read_at={self.cfg.read_at}; see {out_dir}"
            )
        self._finish_run(run_id, trial.number, key, "COMPLETE", None)
        return value

    @staticmethod
    def _frozen(trial: optuna.Trial, trials: list | None = None):
        """The trial as stored (Optuna 5's ``Trial`` has no ``system_attrs``: they hold the retry history)."""
        trials = trial.study.get_trials(deepcopy=False) if trials is None else trials
        return next(t for t in trials if t.number == trial.number)

    def _run_spec(self, number: int, key: int, params: dict[str, Any]) -> RunSpec:
        tags = {
            "optuna.study": self.study_name,
            "optuna.trial": str(number),
            **{f"optuna.params.{k}": str(v) for k, v in params.items()},
        }
        return RunSpec(
            kind="trial",
            parent_run_id=self.parent_run_id,
            run_name=f"{self.cfg.pair}/{self.study_name}/trial{key:04d}",
            tags=tags,
        )

    def _finish_run(self, run_id: str | None, number: int, key: int, state: str, note: str | None) -> None:
        """Tag the trial's run with its Optuna outcome; a pruned run that is still open ends FINISHED."""
        if not run_id:
            return
        client = tracking.client(self.tracking_uri)
        tags = {"optuna.state": state, "optuna.trial": str(number)}
        if key != number:
            tags["optuna.retry_of"] = str(key)
        if note:
            tags["optuna.note"] = note
        for k, v in tags.items():
            client.set_tag(run_id, k, v)
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_terminated(run_id, "FINISHED")
