"""The local driver on the announced end of its job (``commrl.run.preempt``): checkpoint, mark, resume.

Through a real Slurm (scancel, requeue, Snakemake): tests/workflow/test_slurm.py.
"""

from __future__ import annotations

import os
import signal

import pytest
from rl_helpers import overrides

from commrl import tracking
from commrl.rl.checkpoint import CheckpointStore
from commrl.rl.config import load_train_config
from commrl.rl.trainer import LocalTrainer
from commrl.run import preempt, record
from commrl.run.hooks import TrainCallbacks

KEYS = ("score/mean", "actor/kl_loss", "comm/bytes_cumulative", "health/alarm")


class SignalDuring(TrainCallbacks):
    """Sends ``signum`` to this process while tick ``step`` is being finished (before its checkpoint)."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum

    def on_tick(self, step: int, metrics: dict[str, float]) -> None:
        if step == self.step:
            os.kill(os.getpid(), self.signum)


def test_sigterm_mid_run_checkpoints_that_tick_and_the_rerun_resumes_into_the_same_run(
    tmp_path, toy_data, small_model
):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "run"
    cfg = load_train_config(
        overrides(small_model, toy_data, out, uri, "condition=method", "rl.ticks=4", "rl.read_at=4")
    )  # checkpoint.every=2: tick 1 is saved only because of the signal
    with preempt.watch(), pytest.raises(preempt.Preempted) as stopped:
        LocalTrainer(cfg, callbacks=SignalDuring(1, signal.SIGTERM)).train()
    assert (stopped.value.tick, stopped.value.signum) == (1, signal.SIGTERM)
    assert CheckpointStore(out / "checkpoints").ticks() == [1]
    assert not (out / "summary.json").exists() and not (out / "final").exists()
    run_id = record.written_run_id(out)
    client = tracking.client(uri)
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"  # not FAILED
    assert (run.data.tags["preempted"], run.data.tags["preempted_by"]) == ("1", "SIGTERM")
    assert [m.step for m in client.get_metric_history(run_id, "score/mean")] == [1]  # flushed

    summary = LocalTrainer(cfg).train()  # the rerun
    assert (summary.ticks_trained, summary.complete, summary.mlflow_run_id) == (4, True, run_id)
    for key in KEYS:
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == [1, 2, 3, 4], key
    assert sorted(m.step for m in client.get_metric_history(run_id, "val/acc")) == [0, 2, 4]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["preempted"] == "1"
