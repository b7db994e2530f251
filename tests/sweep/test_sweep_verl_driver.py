"""Trials of the paper pairs: the ``commrl verl-train`` command line, and the driver that runs it as a
subprocess, relays its MLflow validations and terminates it when pruned.

``commrl verl-train`` needs GPUs; ``sweep_fake_verl_train.py`` stands in for it with the same arguments and
MLflow contract. Its own ``--dry-run`` (CPU) is run when the module exists.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from commrl import tracking
from commrl.errors import ConfigError
from commrl.run import preempt
from commrl.run.hooks import StopTraining, TrainCallbacks
from commrl.run.record import RunSpec
from commrl.sweep.config import SweepConfig
from commrl.sweep.objective import TrialPlan
from commrl.sweep.study import SweepError
from commrl.sweep.trial_config import check_trials, verl_command
from commrl.sweep.verl_driver import VerlDriver

HERE = Path(__file__).resolve().parent
PARAMS = {"rank": 77, "alpha": 0.25, "beta": 0.5, "cadence": 20}


@pytest.fixture
def verl_cfg(sweep_dict) -> SweepConfig:
    sweep_dict.update(
        pair="A",
        driver="verl",
        ticks=8,
        val_every=2,
        read_at=8,
        train_overrides=["actor_rollout_ref.actor.optim.lr=2e-6"],
    )
    sweep_dict["space"]["rank"]["high"] = 256
    sweep_dict["defaults"]["rank"] = 77
    return SweepConfig.from_dict(sweep_dict)


def stand_in(cfg, params, out, run=None):
    """The fake verl-train with exactly the arguments the sweep passes to the real one."""
    real = verl_command(cfg, params, out, run)
    assert real[1:4] == ["-m", "commrl.cli.main", "verl-train"]
    return [sys.executable, str(HERE / "sweep_fake_verl_train.py"), *real[4:]]


class Recorder(TrainCallbacks):
    def __init__(self, stop_at: int | None = None):
        self.seen: list[tuple[str, int, float]] = []
        self.stop_at = stop_at

    def on_tick(self, step, metrics):
        self.seen.append(("tick", step, metrics["health/alarm"]))

    def on_validation(self, step, accuracy):
        self.seen.append(("val", step, accuracy))
        if step == self.stop_at:
            raise StopTraining(f"pruned at tick {step}")


def plan(tmp_path, parent: str | None = None) -> TrialPlan:
    tags = {"optuna.study": "A-method", "optuna.trial": "3", "optuna.params.rank": "77"}
    run = RunSpec("trial", parent, "A/A-method/trial0003", tags)
    return TrialPlan(3, 3, PARAMS, tmp_path / "trial0003", run)


def test_the_command_line(verl_cfg, tmp_path):
    cmd = verl_command(verl_cfg, PARAMS, tmp_path / "t")
    assert cmd[:4] == [sys.executable, "-m", "commrl.cli.main", "verl-train"]
    assert cmd[4:] == [
        "--pair",
        "A",
        "--condition",
        "method",
        "--seed",
        "0",
        "--out",
        str(tmp_path / "t"),
        "ticks=8",
        "read_at=8",
        "val_every=2",
        "method.rank=77",
        "method.alpha=0.25",
        "method.beta=0.5",
        "method.cadence=20",
        "method.delay=20",
        "actor_rollout_ref.actor.optim.lr=2e-6",
    ]


def test_the_driver_relays_validations_and_nests_the_run(env, verl_cfg, tmp_path):
    client = tracking.client()
    exp = tracking.ensure_experiment("commrl/A")
    parent = client.create_run(exp, run_name="sweep/A-method", tags={"kind": "sweep"}).info.run_id
    hooks = Recorder()
    result = VerlDriver(verl_cfg, poll_s=0.2, command=stand_in)(plan(tmp_path, parent), hooks)
    assert result.val_acc == pytest.approx(
        {0: 0.1, 2: 0.1 + 2 / 770, 4: 0.1 + 4 / 770, 6: 0.1 + 6 / 770, 8: 0.1 + 8 / 770}
    )
    assert [s for kind, s, _ in hooks.seen if kind == "val"] == [0, 2, 4, 6, 8]
    ticks = [s for kind, s, _ in hooks.seen if kind == "tick"]
    assert ticks == sorted(ticks) and ticks[-1] == 8
    assert hooks.seen.index(("tick", 2, 0.0)) < hooks.seen.index(("val", 2, pytest.approx(0.1 + 2 / 770)))
    assert (result.ticks_trained, result.read_at, result.driver) == (8, 8, "verl")  # the child's summary
    run = client.get_run(result.mlflow_run_id)
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.tags["kind"] == "trial" and run.data.tags["optuna.trial"] == "3"
    assert {k: run.data.tags[k] for k in ("pair", "condition", "read_at", "ticks")} == {
        "pair": "A",
        "condition": "method",
        "read_at": "8",
        "ticks": "8",
    }
    assert run.info.run_name == "A/A-method/trial0003"
    assert "method.delay=20" in (tmp_path / "trial0003" / "args.txt").read_text()


def test_the_trial_run_is_placed_by_the_child_from_its_creation(verl_cfg, tmp_path):
    """``--run-spec`` carries the trial's placement, so no tag is set after the fact (a retry's child
    reopening the run cannot undo the driver's tags)."""
    spec = plan(tmp_path, "parent123").run
    cmd = verl_command(verl_cfg, PARAMS, tmp_path / "t", spec)
    at = cmd.index("--run-spec")
    assert RunSpec.from_json(cmd[at + 1]) == spec
    assert spec.placement_tags()["mlflow.parentRunId"] == "parent123"


def test_a_child_that_exits_0_without_a_summary_fails_the_trial(env, verl_cfg, tmp_path):
    def no_summary(cfg, params, out, run=None):
        return [sys.executable, "-c", "pass"]

    with pytest.raises(SweepError, match=r"summary.json does not exist"):
        VerlDriver(verl_cfg, poll_s=0.2, command=no_summary)(plan(tmp_path), Recorder())


def test_a_child_preempted_after_its_checkpoint_preempts_the_trial(env, verl_cfg, tmp_path):
    """The child starts with SIGUSR1 ignored (its Ray helpers must survive Slurm's warning); its exit 75
    (checkpoint written) becomes ``Preempted``, which re-enqueues the trial."""

    def preempted(cfg, params, out, run=None):
        ignored = "signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN"
        return [sys.executable, "-c", f"import signal, sys; sys.exit(75 if {ignored} else 1)"]

    with pytest.raises(preempt.Preempted):
        VerlDriver(verl_cfg, poll_s=0.2, command=preempted)(plan(tmp_path), Recorder())


def _dies_of_sigterm(also_the_worker: bool):
    """A stand-in verl child that dies of SIGTERM, sending it to its worker first when ``also_the_worker``
    (as Slurm signals every process of the job step)."""
    worker = "os.kill(os.getppid(), signal.SIGTERM); " if also_the_worker else ""
    code = f"import os, signal; {worker}os.kill(os.getpid(), signal.SIGTERM)"
    return lambda cfg, params, out, run=None: [sys.executable, "-c", code]


def test_a_child_killed_by_the_jobs_sigterm_preempts_the_trial_not_fails_it(env, verl_cfg, tmp_path):
    """A bare SIGTERM (preemption, the time limit) reaches the worker and its verl child alike; the child
    dies of it (status -15, that step not checkpointed): the worker, which got it too, reports a
    preemption, so the trial is retried from its last checkpoint rather than failed as a crash."""
    with preempt.watch(), pytest.raises(preempt.Preempted) as stop:
        VerlDriver(verl_cfg, poll_s=0.2, command=_dies_of_sigterm(True))(plan(tmp_path), Recorder())
    assert stop.value.signal_name == "SIGTERM"
    with preempt.watch(), pytest.raises(SweepError, match=r"exited with status -15"):  # the child alone
        VerlDriver(verl_cfg, poll_s=0.2, command=_dies_of_sigterm(False))(plan(tmp_path), Recorder())


def test_a_pruned_trial_terminates_the_subprocess(env, verl_cfg, tmp_path):
    hooks = Recorder(stop_at=2)
    with pytest.raises(StopTraining, match="pruned at tick 2"):
        VerlDriver(verl_cfg, poll_s=0.2, command=stand_in)(plan(tmp_path), hooks)
    out = tmp_path / "trial0003"
    assert (out / "terminated").read_text() == "SIGTERM\n"
    run = tracking.client().get_run((out / "mlflow_run_id").read_text().strip())
    assert run.info.status == "FINISHED" and run.data.tags["stopped_early"] == "pruned at tick 2"


def test_a_failing_subprocess_fails_the_trial_with_its_log(env, verl_cfg, tmp_path):
    cfg = dataclasses.replace(verl_cfg, train_overrides=("fail=1",))
    with pytest.raises(SweepError, match=r"exited with status 2; see .*verl-train.log"):
        VerlDriver(cfg, poll_s=0.2, command=stand_in)(plan(tmp_path), Recorder())


CHILD = """
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
time.sleep(120)
"""
PARENT = """
import subprocess, sys, time
from commrl.sweep.verl_driver import guarded
subprocess.Popen(guarded([sys.executable, sys.argv[1], sys.argv[2]]))
time.sleep(120)
"""


def alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" not in status.read_text()
    except FileNotFoundError:
        return False


def test_the_child_dies_with_the_worker(tmp_path):
    """kill -9 of the worker must not leave its training running (the retry would train beside it)."""
    (tmp_path / "child.py").write_text(CHILD)
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "child.py"), str(pid_file)])
    deadline = time.time() + 60
    while not (pid_file.is_file() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    pid = int(pid_file.read_text())
    assert alive(pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(pid)


@pytest.mark.skipif(
    importlib.util.find_spec("commrl.cli.verl_train") is None,
    reason="commrl verl-train is not in this checkout yet",
)
def test_verl_train_dry_run_takes_the_sweeps_arguments(verl_cfg, tmp_path):
    """The real ``commrl verl-train --dry-run`` (CPU): the trial's ticks and knobs reach verl's config."""
    cmd = [*verl_command(verl_cfg, PARAMS, tmp_path / "dry"), "--dry-run"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert resolved["trainer"]["total_training_steps"] == 8  # not pair A's 150 for `method`
    assert resolved["trainer"]["test_freq"] == 2
    method = json.loads(resolved["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]["COMMRL_METHOD"])
    assert {k: method[k] for k in ("rank", "alpha", "beta", "cadence", "delay")} == {**PARAMS, "delay": 20}


@pytest.mark.skipif(
    importlib.util.find_spec("commrl.cli.verl_train") is None,
    reason="commrl verl-train is not in this checkout yet",
)
def test_init_dry_runs_the_paper_trials_and_rejects_a_bad_override(env, verl_cfg):
    bad = dataclasses.replace(verl_cfg, train_overrides=("trainer.no_such_key=1",))
    with pytest.raises(ConfigError, match=r"defaults \{'rank': 77.*is not a valid verl-train run"):
        check_trials(bad)


def test_a_poll_between_a_ticks_logs_never_relays_its_validation_before_its_alarm():
    """The child logs tick 2's alarm and validation while the driver reads the two histories. A stand-in
    for the MLflow client (the only way to place that moment deterministically) logs them between the
    driver's two reads: read alarm-first, validation 2 went to the hooks before alarm 2 (the real-store
    test above failed so once in CI)."""
    from types import SimpleNamespace

    class Store:
        def __init__(self):
            self.logged = {"health/alarm": [1], "val/acc": [0]}
            self.reads = 0

        def get_metric_history(self, run_id, key):
            out = [SimpleNamespace(step=s, value=0.5) for s in self.logged[key]]
            self.reads += 1
            if self.reads == 1:  # the child logs tick 2, alarm then validation
                self.logged["health/alarm"].append(2)
                self.logged["val/acc"].append(2)
            return out

    hooks, seen, store = Recorder(), set(), Store()
    VerlDriver._relay(store, "run", hooks, seen)
    VerlDriver._relay(store, "run", hooks, seen)
    order = [(kind, step) for kind, step, _ in hooks.seen]
    assert order.index(("tick", 2)) < order.index(("val", 2)), order
