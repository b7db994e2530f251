"""A worker killed with SIGKILL in the middle of a trial, then rerun: the trial is retried with the same
params, resumes from its folder, and the study ends with exactly the asked number of finished trials. A
trial is retried once however many paths see it die (killed between the preempt path's queued retry and its
tell, reaped by two workers, finished after all), and a preempted retry stops at heartbeat.max_retry.

The workers are real processes on a real storage (sqlite + Optuna's heartbeat, or a journal file + the DIY
heartbeat); the trials use the fast stand-in driver of ``sweep_fakes`` (the real trainer: test_sweep_e2e).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState
from sweep_fakes import FakeDriver

from commrl.cli.main import main
from commrl.errors import ConfigError
from commrl.run import preempt
from commrl.run.hooks import TrainCallbacks
from commrl.sweep import objective
from commrl.sweep.config import SweepConfig, load_sweep_config
from commrl.sweep.heartbeat import reap_stale_trials
from commrl.sweep.storage import retry_history
from commrl.sweep.study import SweepError, init_study, open_study
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

    with pytest.raises(KeyboardInterrupt):
        run_worker(cfg, "ctrl-c", 0, driver=driver_raising(cfg, KeyboardInterrupt))
    study = open_study(cfg, "ctrl-c")
    first, retry = study.get_trials()
    assert (first.state, retry.state) == (TrialState.FAIL, TrialState.WAITING)
    assert retry.params == first.params == cfg.defaults
    run_worker(cfg, "ctrl-c", 0, driver=FakeDriver(cfg.ticks, cfg.val_every))
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    starts = (trials_dir(cfg, "ctrl-c") / "trial0000" / "starts.txt").read_text().split("\n")
    assert [line.split()[0] for line in starts if line] == ["0", "3"]  # the retry resumed at tick 3


def driver_raising(cfg: SweepConfig, error: Callable[[], BaseException]):
    """The fast driver, raising ``error()`` at tick 3, after its checkpoint (Ctrl-C, a preemption's
    ``Preempted``, a verl child's non-zero exit)."""

    def stopped(plan, hooks):
        class Hooks(TrainCallbacks):
            def on_tick(self, step, metrics):
                if step == 3:
                    raise error()
                hooks.on_tick(step, metrics)

            def on_validation(self, step, accuracy):
                hooks.on_validation(step, accuracy)

        return FakeDriver(cfg.ticks, cfg.val_every)(plan, Hooks())

    return stopped


def test_a_crashed_trial_is_queued_again_and_a_rerun_resumes_it_but_a_bad_setting_is_not(env, sweep_dict):
    """A trial whose training crashes (here the verl driver's error for a child that died) ends FAIL with
    its retry queued, same params: the rerun resumes it from its checkpoint instead of starting a new point
    (trial 0 holds the note's defaults). A ``ConfigError`` would fail the same way again: no retry."""
    sweep_dict.update(n_trials=2)
    cfg = SweepConfig.from_dict(sweep_dict)
    init_study(cfg, "crash")

    def died() -> SweepError:
        return SweepError("verl-train exited with status 1 (NCCL timeout)")

    with pytest.raises(SweepError) as raised:
        run_worker(cfg, "crash", 0, driver=driver_raising(cfg, died))
    assert raised.value.__notes__ == ["trial 0 re-enqueued with the same params"]
    study = open_study(cfg, "crash")
    first, retry = study.get_trials()
    assert (first.state, retry.state) == (TrialState.FAIL, TrialState.WAITING)
    assert retry.params == first.params == cfg.defaults and retry_history(retry) == [0]
    assert first.user_attrs["note"].startswith("crashed: SweepError: verl-train exited with status 1")
    run_worker(cfg, "crash", 0, driver=FakeDriver(cfg.ticks, cfg.val_every))
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    starts = (trials_dir(cfg, "crash") / "trial0000" / "starts.txt").read_text().split("\n")
    assert [line.split()[0] for line in starts if line] == ["0", "3"]  # the retry resumed at tick 3

    init_study(cfg, "bad")
    with pytest.raises(ConfigError):
        run_worker(cfg, "bad", 0, driver=driver_raising(cfg, lambda: ConfigError("method.rank=0 is invalid")))
    assert [t.state for t in open_study(cfg, "bad").get_trials()] == [TrialState.FAIL]


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
    return driver_raising(cfg, lambda: preempt.Preempted(3, signal.SIGUSR1))


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


def chains(study) -> list[tuple[TrialState, list[int]]]:
    """Each trial's state and the trials it retries."""
    return [(t.state, retry_history(t)) for t in study.get_trials()]


@pytest.mark.parametrize("backend", ["sqlite", "journal"])
def test_a_preempted_retry_with_its_retries_used_is_not_queued_again(env, tmp_path, sweep_dict, backend):
    """A retry preempted in its turn is queued again only within heartbeat.max_retry; its note says which
    (Optuna's retry callback appends to the history of the trial object it is given: on a journal storage
    that was the stored trial itself, which then looked like its own retry)."""
    sweep_dict.update(n_trials=1, heartbeat={"interval": 1, "grace": 3, "max_retry": 1})
    if backend == "journal":
        sweep_dict["storage"] = str(tmp_path / "shared" / "tiny.journal")
    cfg = SweepConfig.from_dict(sweep_dict)
    init_study(cfg, "again")

    def preempted(plan, hooks):
        raise preempt.Preempted(3, signal.SIGUSR1)

    for _ in range(2):
        with pytest.raises(preempt.Preempted):
            run_worker(cfg, "again", 0, driver=preempted)
    study = open_study(cfg, "again")
    assert chains(study) == [(TrialState.FAIL, []), (TrialState.FAIL, [0])]
    note = study.get_trials()[1].user_attrs["note"]
    assert note.endswith("trial 1 not re-enqueued: its retries reached heartbeat.max_retry=1")


def preempted_then_killed(cfg: SweepConfig, study: str) -> None:
    """A worker whose first trial is preempted and which is SIGKILLed once the trial's retry is queued, before
    Optuna's tell marks the trial FAIL (Slurm's KillWait ran out; a tell failing on a locked storage)."""
    queue = objective.enqueue_retry

    def queue_then_killed(*args, **kwargs):
        queue(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    def preempted(plan, hooks):
        raise preempt.Preempted(3, signal.SIGTERM)

    objective.enqueue_retry = queue_then_killed  # in the child process only
    run_worker(cfg, study, 0, driver=preempted)


@pytest.mark.parametrize("backend", ["sqlite", "journal"])
def test_a_trial_killed_between_its_queued_retry_and_its_tell_is_retried_once(
    env, tmp_path, sweep_dict, backend
):
    """The trial stays RUNNING with its retry queued. The next worker runs the retry at once (the dead trial
    and its retry hold one budget slot); a reaper fails the dead trial later (the worker's own, if its run
    outlasts the grace) and queues no second retry, so the point trains once and the budget's other slot goes
    to a new point."""
    sweep_dict.update(n_trials=2)
    if backend == "journal":
        sweep_dict["storage"] = str(tmp_path / "shared" / "tiny.journal")
    cfg = SweepConfig.from_dict(sweep_dict)
    init_study(cfg, "gap")
    child = multiprocessing.get_context("fork").Process(target=preempted_then_killed, args=(cfg, "gap"))
    child.start()
    child.join()
    assert child.exitcode == -signal.SIGKILL
    study = open_study(cfg, "gap")
    assert chains(study) == [(TrialState.RUNNING, []), (TrialState.WAITING, [0])]

    run_worker(cfg, "gap", 1, driver=FakeDriver(cfg.ticks, cfg.val_every))
    dead, *rest = chains(study)
    assert rest == [(TrialState.COMPLETE, [0]), (TrialState.COMPLETE, [])]
    # the worker's own reaper fails the dead trial when its run outlasts the grace (a slow machine): no retry
    assert dead in ((TrialState.RUNNING, []), (TrialState.FAIL, []))
    time.sleep(cfg.heartbeat.grace + 1.5)
    assert reap_stale_trials(study, cfg.heartbeat) == ([0] if dead[0] == TrialState.RUNNING else [])
    assert chains(study) == [(TrialState.FAIL, []), (TrialState.COMPLETE, [0]), (TrialState.COMPLETE, [])]
    params = [t.params for t in study.get_trials()]
    assert params[0] == params[1] == cfg.defaults != params[2]


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_only_the_first_retry_of_an_unfinished_trial_trains(env, tmp_path, sweep_dict):
    """Two reapers that see a trial die at the same moment can both queue its retry, and a reaper can queue
    the retry of a late trial that then finishes after all: only the first retry of a trial that did not
    finish trains; the others end FAIL at once, saying why."""
    sweep_dict.update(n_trials=3, storage=str(tmp_path / "shared" / "tiny.journal"))
    cfg = SweepConfig.from_dict(sweep_dict)
    init_study(cfg, "twice")
    study = open_study(cfg, "twice")
    dead, late = study.ask(), study.ask()  # 0 (the defaults) and 1
    for trial in (dead, late):
        cfg.space.suggest(trial)
    queue = RetryHeartbeatStaleTrialCallback(max_retry=2, inherit_intermediate_values=True)
    queue(study, study.get_trials()[dead.number])  # 2
    queue(study, study.get_trials()[dead.number])  # 3: the other reaper's
    queue(study, study.get_trials()[late.number])  # 4
    study.tell(late, 0.5)
    study.tell(dead, state=TrialState.FAIL)

    run_worker(cfg, "twice", 0, driver=FakeDriver(cfg.ticks, cfg.val_every))
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "COMPLETE", "FAIL", "FAIL", "COMPLETE"]
    assert trials[3].user_attrs["note"] == "trial 0 is retried by trial 2"
    assert trials[4].user_attrs["note"] == "trial 1 ended COMPLETE: no retry needed"
    assert trials[2].params == cfg.defaults
    starts = (trials_dir(cfg, "twice") / "trial0000" / "starts.txt").read_text().splitlines()
    assert [line.split()[2] for line in starts] == ["2"]  # the point trained once
