"""Trials of the paper pairs: ``commrl verl-train`` as a subprocess, watched through MLflow.

The cluster driver owns its GPUs, so a trial runs it as a child process (output in ``<out>/verl-train.log``)
that creates its MLflow run already placed as the trial's (``--run-spec``: kind ``trial``, nested under the
sweep), and polls that run (``<out>/mlflow_run_id``) for ``val/acc`` and ``health/alarm``, which it feeds
to the same hooks as the local trainer. The trial's outcome is the ``summary.json`` the child wrote. When
the hooks stop the trial, the child's process group gets SIGTERM (SIGKILL after a grace period) and the run
ends FINISHED with tag ``stopped_early``. The child also gets SIGTERM when the worker dies
(``PR_SET_PDEATHSIG``), so a killed worker leaves no orphan training on its node; the retry resumes from the
run's checkpoints. The child starts with SIGUSR1 ignored (``preempt.shield``: its Ray helpers must survive
Slurm's warning); when it exits 75 (preempted, checkpoint written) the trial raises ``preempt.Preempted``.
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
from commrl.run import preempt, record
from commrl.run.hooks import StopTraining, TrainCallbacks
from commrl.run.record import RunSpec
from commrl.run.summary import RunSummary, SummaryError
from commrl.sweep.config import SweepConfig
from commrl.sweep.objective import TrialPlan
from commrl.sweep.study import SweepError
from commrl.sweep.trial_config import verl_command

POLL_S = 30.0  # seconds between two looks at the run's metrics
TERM_GRACE_S = 60.0  # seconds a stopped child has to checkpoint and exit before SIGKILL
# Exec'd in front of the child on Linux: asks for SIGTERM when the worker dies (prctl PR_SET_PDEATHSIG = 1),
# exits if the worker died already, ignores SIGUSR1 (inherited across exec, as ``preempt.shield``). (A
# preexec_fn would do the same but is unsafe with the heartbeat thread.)
_ORPHAN_GUARD = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
    "signal.signal(signal.SIGUSR1, signal.SIG_IGN); "
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
        command: Callable[[SweepConfig, Mapping[str, Any], Path, RunSpec], list[str]] = verl_command,
    ):
        self.cfg = cfg
        self.poll_s = poll_s
        self.command = command

    def __call__(self, plan: TrialPlan, hooks: TrainCallbacks) -> RunSummary:
        plan.out_dir.mkdir(parents=True, exist_ok=True)
        log_path = plan.out_dir / "verl-train.log"
        client = tracking.client()
        run_id: str | None = None
        seen: set[tuple[str, int]] = set()
        with open(log_path, "ab") as log:
            command = guarded(self.command(self.cfg, plan.params, plan.out_dir, plan.run))
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                while True:
                    done = proc.poll() is not None
                    if run_id is None:
                        run_id = record.written_run_id(plan.out_dir)
                    if run_id is not None:
                        self._relay(client, run_id, hooks, seen)
                    if done:
                        break
                    time.sleep(self.poll_s)
            except StopTraining as stop:
                self._terminate(proc)
                record.finish_run(run_id, "FINISHED", {"stopped_early": str(stop)})
                raise
            except BaseException:
                self._terminate(proc)
                raise
        # exit 75: the child checkpointed; any other status while this worker got the job's signal too (a
        # bare SIGTERM reaches every process of the job step, and verl's step is lost): a preemption all the
        # same, so the trial is retried, not failed as a crash
        if proc.returncode == preempt.EXIT_PREEMPTED or (proc.returncode != 0 and preempt.requested()):
            raise preempt.Preempted(None, preempt.received())
        if proc.returncode != 0:
            raise SweepError(f"commrl verl-train exited with status {proc.returncode}; see {log_path}")
        try:
            return RunSummary.read(plan.out_dir)
        except SummaryError as err:
            raise SweepError(f"commrl verl-train exited 0 but {err}; see {log_path}") from None

    @staticmethod
    def _relay(client, run_id: str, hooks: TrainCallbacks, seen: set) -> None:
        """New ``health/alarm`` and ``val/acc`` points by step (a tick's alarm before its validation).

        ``val/acc`` is read first: a tick's alarm is logged with its validation or before it, so the alarm
        read after it is there too (read the other way round, a poll between the two reads relayed a
        validation before its tick's alarm)."""
        events = []
        for order, key in ((1, "val/acc"), (0, "health/alarm")):  # order: a step's alarm sorts first
            for m in client.get_metric_history(run_id, key):
                if (key, m.step) not in seen:
                    events.append((m.step, order, key, m.value))
        for step, _, key, value in sorted(events):
            seen.add((key, step))
            if key == "val/acc":
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
