"""Trials of the paper pairs: ``commrl verl-train`` as a subprocess, watched through MLflow.

The cluster driver owns its GPUs, so a trial runs it as a child process (output in ``<out>/verl-train.log``)
and polls its MLflow run (``<out>/mlflow_run_id``, experiment ``commrl/<pair>``) for ``val/acc`` and
``health/alarm``, which it feeds to the same hooks as the local trainer. When the hooks stop the trial,
the child's process group gets SIGTERM (SIGKILL after a grace period) and the run ends FINISHED with
tag ``stopped_early``. The child also gets SIGTERM when the worker dies (``PR_SET_PDEATHSIG``), so a
killed worker leaves no orphan training on its node; the retry resumes from the run's checkpoints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from commrl import tracking
from commrl.rl.trainer import StopTraining, TrainCallbacks, TrainResult
from commrl.sweep.config import SweepConfig
from commrl.sweep.objective import TrialPlan
from commrl.sweep.study import SweepError
from commrl.sweep.trial_config import RUN_ID_FILE, verl_command

POLL_S = 30.0  # seconds between two looks at the run's metrics
TERM_GRACE_S = 60.0  # seconds a stopped child has to checkpoint and exit before SIGKILL
# Exec'd in front of the child on Linux: asks for SIGTERM when the worker dies (prctl PR_SET_PDEATHSIG = 1),
# exits if the worker died already. (A preexec_fn would do the same but is unsafe with the heartbeat thread.)
_ORPHAN_GUARD = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
    "os.getppid() == int(sys.argv[1]) or sys.exit(1); os.execvp(sys.argv[2], sys.argv[2:])"
)


def guarded(command: list[str]) -> list[str]:
    """``command`` wrapped so that it gets SIGTERM when this process dies (Linux; unchanged elsewhere)."""
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-c", _ORPHAN_GUARD, str(os.getpid()), *command]


class VerlDriver:
    """Runs one trial's ``commrl verl-train`` and relays its validations to the hooks."""

    def __init__(
        self,
        cfg: SweepConfig,
        poll_s: float = POLL_S,
        command: Callable[[SweepConfig, Mapping[str, Any], Path], list[str]] = verl_command,
    ):
        self.cfg = cfg
        self.poll_s = poll_s
        self.command = command

    def __call__(self, plan: TrialPlan, hooks: TrainCallbacks) -> TrainResult:
        plan.out_dir.mkdir(parents=True, exist_ok=True)
        log_path = plan.out_dir / "verl-train.log"
        client = tracking.client()
        run_id: str | None = None
        val_acc: dict[int, float] = {}
        seen: set[tuple[str, int]] = set()
        with open(log_path, "ab") as log:
            command = guarded(self.command(self.cfg, plan.params, plan.out_dir))
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                while True:
                    done = proc.poll() is not None
                    if run_id is None:
                        run_id = self._adopt_run(plan, client)
                    if run_id is not None:
                        self._relay(client, run_id, hooks, val_acc, seen)
                    if done:
                        break
                    time.sleep(self.poll_s)
            except StopTraining as stop:
                self._terminate(proc)
                if run_id is not None:
                    client.set_tag(run_id, "stopped_early", str(stop))
                    client.set_terminated(run_id, "FINISHED")
                raise
            except BaseException:
                self._terminate(proc)
                raise
        if proc.returncode != 0:
            raise SweepError(f"commrl verl-train exited with status {proc.returncode}; see {log_path}")
        if run_id is None:
            raise SweepError(
                f"commrl verl-train finished without {plan.out_dir / RUN_ID_FILE}; see {log_path}"
            )
        trained = max(val_acc, default=0)
        return TrainResult(self.cfg.ticks, trained, run_id, str(plan.out_dir / "final"), val_acc)

    def _adopt_run(self, plan: TrialPlan, client) -> str | None:
        """Once the child has created its run: nest it under the sweep and tag it as this trial's."""
        path = plan.out_dir / RUN_ID_FILE
        if not path.is_file() or not path.read_text().strip():
            return None
        run_id = path.read_text().strip()
        tags = {"kind": plan.run.kind, **plan.run.tags}
        if plan.run.parent_run_id:
            tags["mlflow.parentRunId"] = plan.run.parent_run_id
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
        if plan.run.run_name:
            client.update_run(run_id, name=plan.run.run_name)
        return run_id

    @staticmethod
    def _relay(client, run_id: str, hooks: TrainCallbacks, val_acc: dict[int, float], seen: set) -> None:
        """New ``health/alarm`` and ``val/acc`` points by step (a tick's alarm before its validation)."""
        events = []
        for order, key in enumerate(("health/alarm", "val/acc")):
            for m in client.get_metric_history(run_id, key):
                if (key, m.step) not in seen:
                    events.append((m.step, order, key, m.value))
        for step, _, key, value in sorted(events):
            seen.add((key, step))
            if key == "val/acc":
                val_acc[step] = value
                hooks.on_validation(step, value)
            else:
                hooks.on_tick(step, {"health/alarm": value})

    @staticmethod
    def _terminate(proc: subprocess.Popen) -> None:
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
