"""A worker killed with SIGKILL in the middle of a trial, then rerun: the trial is retried with the same
params, resumes from its folder, and the study ends with exactly the asked number of finished trials.

The workers are real processes on a real storage (sqlite + Optuna's heartbeat, or a journal file + the DIY
heartbeat); the trials use the fast stand-in driver of ``sweep_fakes`` (the real trainer: test_sweep_e2e).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState
from sweep_fakes import FakeDriver

from commrl.cli.main import main
from commrl.run import preempt
from commrl.run.hooks import TrainCallbacks
from commrl.sweep.config import SweepConfig, load_sweep_config
from commrl.sweep.storage import retry_history
from commrl.sweep.study import init_study, open_study
from commrl.sweep.trial_config import trials_dir
from commrl.sweep.worker import run_worker

HERE = Path(__file__).resolve().parent
WORKER = HERE / "sweep_fake_worker.py"


def start_worker(config: Path, worker: int, out: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(config), "kill", str(worker), str(out), "0.2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def trial_of(pid: int, root: Path, min_tick: int) -> tuple[Path, int] | None:
    """The folder and number of the trial that process ``pid`` runs, once it trained ``min_tick`` ticks."""
    for starts in root.glob("trial*/starts.txt"):
        for line in starts.read_text().splitlines():
            _, owner, number = (int(x) for x in line.split())
            progress = starts.parent / "progress.json"
            if owner == pid and progress.is_file() and json.loads(progress.read_text())["tick"] >= min_tick:
                return starts.parent, number
    return None


@pytest.mark.parametrize("backend", ["sqlite", "journal"])
def test_kill_9_mid_trial_then_rerun_finishes_the_budget(env, tmp_path, sweep_dict, write_config, backend):
    sweep_dict.update(n_trials=4, ticks=8, val_every=2, read_at=8)
    if backend == "journal":
        sweep_dict["storage"] = str(tmp_path / "shared" / "tiny.journal")
    config = write_config(sweep_dict)
    cfg = load_sweep_config(config)
    assert main(["sweep", "init", "--config", str(config), "--study", "kill"]) == 0
    root = trials_dir(cfg, "kill")

    a = start_worker(config, 0, tmp_path / "w0.json", env)
    b = start_worker(config, 1, tmp_path / "w1.json", env)
    deadline = time.time() + 120
    victim = None
    while victim is None and time.time() < deadline and b.poll() is None:
        time.sleep(0.1)
        victim = trial_of(b.pid, root, min_tick=3)
    assert victim is not None, b.communicate()[0] if b.poll() is not None else "worker 1 never got to tick 3"
    os.kill(b.pid, signal.SIGKILL)
    b.wait()
    folder, killed = victim

    rerun = start_worker(config, 1, tmp_path / "w1.json", env)
    for proc in (a, rerun):
        output = proc.communicate(timeout=240)[0]
        assert proc.returncode == 0, output

    trials = {t.number: t for t in open_study(cfg, "kill").get_trials()}
    states = [t.state for t in trials.values()]
    assert states.count(TrialState.COMPLETE) + states.count(TrialState.PRUNED) == 4
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states
    assert trials[killed].state == TrialState.FAIL
    retries = [t for t in trials.values() if retry_history(t)[:1] == [killed]]
    assert len(retries) == 1
    assert retries[0].state == TrialState.COMPLETE
    assert retries[0].params == trials[killed].params
    assert retries[0].user_attrs["retry_of"] == killed
    starts = [int(line.split()[0]) for line in (folder / "starts.txt").read_text().splitlines()]
    assert starts[0] == 0 and starts[-1] >= 3  # the retry resumed where the killed trial stopped
    records = [json.loads((tmp_path / f"w{w}.json").read_text()) for w in (0, 1)]
    assert any(r["study_complete"] for r in records)


def test_ctrl_c_requeues_the_trial_and_a_rerun_resumes_it(env, sweep_dict):
    """Ctrl-C (SIGINT) mid-trial: Optuna marks the trial FAIL; its retry is queued like a killed one's."""
    sweep_dict.update(n_trials=2)
    cfg = SweepConfig.from_dict(sweep_dict)
    init_study(cfg, "ctrl-c")

    def interrupted(plan, hooks):
        class Hooks(TrainCallbacks):
            def on_tick(self, step, metrics):
                if step == 3:
                    raise KeyboardInterrupt
                hooks.on_tick(step, metrics)

            def on_validation(self, step, accuracy):
                hooks.on_validation(step, accuracy)

        return FakeDriver(cfg.ticks, cfg.val_every)(plan, Hooks())

    with pytest.raises(KeyboardInterrupt):
        run_worker(cfg, "ctrl-c", 0, driver=interrupted)
    study = open_study(cfg, "ctrl-c")
    first, retry = study.get_trials()
    assert (first.state, retry.state) == (TrialState.FAIL, TrialState.WAITING)
    assert retry.params == first.params == cfg.defaults
    run_worker(cfg, "ctrl-c", 0, driver=FakeDriver(cfg.ticks, cfg.val_every))
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    starts = (trials_dir(cfg, "ctrl-c") / "trial0000" / "starts.txt").read_text().split("\n")
    assert [line.split()[0] for line in starts if line] == ["0", "3"]  # the retry resumed at tick 3


def test_a_preempted_trial_is_queued_again_at_once_and_a_signalled_worker_starts_no_trial(env, sweep_dict):
    """The trainer checkpointed on SIGUSR1 and raised ``Preempted``: the trial ends FAIL with its retry
    WAITING at once (same params, no heartbeat grace to wait for); a worker signalled between trials starts
    none; the rerun resumes the trial where it stopped and the study ends with exactly ``n_trials``."""
    sweep_dict.update(n_trials=2)
    cfg = SweepConfig.from_dict(sweep_dict)
    init_study(cfg, "preempt")
    with pytest.raises(preempt.Preempted):
        run_worker(cfg, "preempt", 0, driver=preempting_driver(cfg))
    study = open_study(cfg, "preempt")
    first, retry = study.get_trials()
    assert (first.state, retry.state) == (TrialState.FAIL, TrialState.WAITING)
    assert retry.params == first.params and retry_history(retry) == [first.number]
    note = "preempted by SIGUSR1 after tick 3 (checkpoint written); trial 0 re-enqueued with the same params"
    assert first.user_attrs["note"] == note

    with preempt.watch():
        os.kill(os.getpid(), signal.SIGUSR1)
        with pytest.raises(preempt.Preempted):
            run_worker(cfg, "preempt", 0, driver=FakeDriver(cfg.ticks, cfg.val_every))
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL, TrialState.WAITING]

    run_worker(cfg, "preempt", 0, driver=FakeDriver(cfg.ticks, cfg.val_every))
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    starts = (trials_dir(cfg, "preempt") / "trial0000" / "starts.txt").read_text().split("\n")
    assert [line.split()[0] for line in starts if line] == ["0", "3"]


def preempting_driver(cfg: SweepConfig):
    """The fast driver, preempted (checkpointed on SIGUSR1) at tick 3."""

    def preempted(plan, hooks):
        class Hooks(TrainCallbacks):
            def on_tick(self, step, metrics):
                if step == 3:
                    raise preempt.Preempted(3, signal.SIGUSR1)
                hooks.on_tick(step, metrics)

            def on_validation(self, step, accuracy):
                hooks.on_validation(step, accuracy)

        return FakeDriver(cfg.ticks, cfg.val_every)(plan, Hooks())

    return preempted


@pytest.mark.parametrize(
    ("max_retry", "outcome"),
    [
        (2, "trial 0 re-enqueued with the same params"),
        (0, "trial 0 not re-enqueued: its retries reached heartbeat.max_retry=0"),
    ],
)
def test_a_preempted_worker_says_whether_its_trial_was_queued_again(
    env, sweep_dict, write_config, monkeypatch, capsys, max_retry, outcome
):
    """With its retries used (max_retry), a preempted trial is not queued again: its note and the worker's
    message say so, as they say it was when it was."""
    sweep_dict.update(n_trials=2, heartbeat={"interval": 1, "grace": 3, "max_retry": max_retry})
    config = write_config(sweep_dict)
    cfg = load_sweep_config(config)
    assert main(["sweep", "init", "--config", str(config), "--study", "p"]) == 0
    monkeypatch.setattr("commrl.sweep.worker.check_trials", lambda cfg: None)
    monkeypatch.setattr("commrl.sweep.worker.default_driver", preempting_driver)
    assert main(["sweep", "worker", "--config", str(config), "--study", "p"]) == preempt.EXIT_PREEMPTED
    err = capsys.readouterr().err
    assert f"worker 0: preempted by SIGUSR1 after tick 3 (checkpoint written); {outcome}; rerun" in err
    trials = open_study(cfg, "p").get_trials()
    assert trials[0].user_attrs["note"].endswith(outcome)
    assert [t.state for t in trials] == [TrialState.FAIL] + [TrialState.WAITING] * (max_retry > 0)
