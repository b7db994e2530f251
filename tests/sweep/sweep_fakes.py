"""A fast stand-in for the training run of a trial, for the Optuna mechanics (budget, retries, kills).

The real trials run ``LocalTrainer`` (see test_sweep_e2e.py); this driver keeps the trainer's contract
that the sweep relies on: it resumes from its own progress in ``out_dir``, calls ``on_tick`` every tick and
``on_validation`` every ``val_every`` ticks, and returns a ``RunSummary``. With ``with_mlflow`` it also
opens the trial's MLflow run through the trainer's own run record (``commrl.run.record``, placed by
``plan.run``) and leaves it RUNNING when stopped, the worst case the sweep must close.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from commrl import tracking
from commrl.run import record
from commrl.run.hooks import StopTraining
from commrl.run.summary import RunSummary


def fake_accuracy(params: dict, step: int) -> float:
    """Best near the defaults (rank 6, alpha .25, beta .25, cadence 5), rising with the step; at tick 0 the
    base model's, the same for every trial and above the early ticks (as in the tiny pair)."""
    if step == 0:
        return 0.9
    miss = (math.log(params["rank"] / 6)) ** 2 + (params["alpha"] - 0.25) ** 2 + (params["beta"] - 0.25) ** 2
    miss += ((params["cadence"] - 5) / 10) ** 2
    return max(0.0, 1.0 - miss) * (step + 1) / (step + 2)


class FakeDriver:
    def __init__(
        self,
        ticks: int,
        val_every: int,
        sleep: float = 0.0,
        with_mlflow: bool = False,
        alarm_at: int | None = None,
    ):
        self.ticks = ticks
        self.val_every = val_every
        self.sleep = sleep
        self.with_mlflow = with_mlflow
        self.alarm_at = alarm_at

    def __call__(self, plan, hooks) -> RunSummary:
        out = Path(plan.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        progress = out / "progress.json"
        state = json.loads(progress.read_text()) if progress.is_file() else {"tick": 0, "val": {}}
        start = state["tick"]
        with open(out / "starts.txt", "a") as f:
            f.write(f"{start} {os.getpid()} {plan.number}\n")
        run_id = self._run(plan, out)
        val = {int(k): v for k, v in state["val"].items()}
        try:
            if start == 0:
                val[0] = fake_accuracy(plan.params, 0)
                hooks.on_validation(0, val[0])
            for tick in range(start, self.ticks):
                time.sleep(self.sleep)
                step = tick + 1
                alarm = float(self.alarm_at == step)
                acc = fake_accuracy(plan.params, step) if step % self.val_every == 0 else None
                if acc is not None:
                    val[step] = acc
                state = {"tick": step, "val": {str(k): v for k, v in val.items()}}
                tmp = out / "progress.json.tmp"
                tmp.write_text(json.dumps(state))
                os.replace(tmp, progress)
                if run_id and acc is not None:
                    tracking.client().log_metric(run_id, "val/acc", acc, step=step)
                hooks.on_tick(step, {"health/alarm": alarm})
                if acc is not None:
                    hooks.on_validation(step, acc)
        except StopTraining as stop:
            return self._summary(plan, state["tick"], run_id, None, val, str(stop))
        record.finish_run(run_id, "FINISHED")
        return self._summary(plan, self.ticks, run_id, str(out), val)

    def _summary(self, plan, trained, run_id, final, val, stopped=None) -> RunSummary:
        return RunSummary(
            "tiny", "method", 0, "fake", self.ticks, trained, run_id, final, self.ticks, final, val, stopped
        )

    def _run(self, plan, out: Path) -> str | None:
        if not self.with_mlflow:
            return None
        path = out / "mlflow_run_id"
        if path.is_file():
            return path.read_text().strip()
        client = tracking.client()
        exp = tracking.ensure_experiment(tracking.experiment_name("tiny"))
        tags = {"kind": plan.run.kind, "mlflow.parentRunId": plan.run.parent_run_id, **plan.run.tags}
        run_id = client.create_run(exp, run_name=plan.run.run_name, tags=tags).info.run_id
        path.write_text(run_id + "\n")
        return run_id
