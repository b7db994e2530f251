"""``commrl verl-train`` on the announced end of its job (``commrl.run.preempt``), on CPU: the step logged
after the signal is saved through verl's own ``RayPPOTrainer._save_checkpoint`` (verl's real FSDP2 actor
worker, verl_cpu_harness) and ends ``fit``; a resume validates nothing twice; the driver exits 75 with the
MLflow run marked. What only a GPU run shows: the signal reaching the TaskRunner inside Ray."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from ray.exceptions import RayTaskError
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from commrl.cli import verl_train
from commrl.rl.config import HealthConfig
from commrl.run import preempt, record
from commrl.verl_ext import checkpoint
from commrl.verl_ext import config as vc
from commrl.verl_ext.checkpoint import latest_tick
from commrl.verl_ext.config import method_from_env
from commrl.verl_ext.trainer import HEALTH_FILE, CommrlPPOTrainer, StepChecks, logging_method_names


@pytest.fixture
def signalled():
    """SIGUSR1 received inside ``preempt.watch()``, as the TaskRunner watches it."""
    with preempt.watch():
        os.kill(os.getpid(), signal.SIGUSR1)
        yield


def bare_trainer(cfg, **fields) -> CommrlPPOTrainer:
    """``CommrlPPOTrainer`` without ``__init__`` (Ray pools, dataloaders), with the given attributes."""
    trainer = object.__new__(CommrlPPOTrainer)
    trainer.config, trainer.use_critic = cfg, False
    trainer.checks = StepChecks(method_from_env(), HealthConfig())
    for name, value in fields.items():
        setattr(trainer, name, value)
    return trainer


def test_the_step_logged_after_the_signal_is_saved_by_verl_and_stops_fit(
    cpu_verl, tiny_model_dir, method, tmp_path, monkeypatch, signalled
):
    import verl.utils.tracking as verl_tracking

    method(codec="lowrank", cadence=2)
    cfg = cpu_verl.paper_config(tiny_model_dir, extra=cpu_verl.engine_test_shapes())
    folder = tmp_path / "checkpoints"
    OmegaConf.update(cfg, "trainer.default_local_dir", str(folder))
    worker = cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "commrl")
    loader = SimpleNamespace(state_dict=lambda: {"batches_consumed": 3})
    trainer = bare_trainer(
        cfg, actor_rollout_wg=worker, train_dataloader=loader, total_training_steps=5, global_steps=3
    )
    with logging_method_names(after_log=trainer.stop_if_preempted):  # as fit() runs
        logger = verl_tracking.Tracking("commrl/A", "A/method/seed0", ["console"], config={})
        with pytest.raises(preempt.Preempted) as stopped:
            logger.log({"critic/score/mean": 0.5}, step=3)
        assert (stopped.value.tick, stopped.value.signum) == (3, signal.SIGUSR1)
        step3 = folder / "global_step_3"
        assert latest_tick(folder) == 3 and (step3 / "actor" / "huggingface" / "config.json").is_file()
        assert (step3 / "data.pt").is_file() and (step3 / HEALTH_FILE).is_file()

        def no_second_save():
            raise AssertionError("a step verl saved already was saved again")

        monkeypatch.setattr(trainer, "_save_checkpoint", no_second_save)
        with pytest.raises(preempt.Preempted):  # a save_freq step: verl's own save stands
            logger.log({"critic/score/mean": 0.5}, step=3)
        trainer.global_steps = 5
        logger.log({"critic/score/mean": 0.5}, step=5)  # the last step: fit ends as usual


def test_a_resume_does_not_validate_a_step_that_was_not_due(tmp_path, monkeypatch):
    """Step 4 (a preemption save; test_freq 25) had no validation: none before the resumed training
    (test_resume_validation: a due step whose val/acc a kill lost is validated)."""
    import verl_cpu_harness as harness

    def loaded(self):
        self.global_steps = 4

    monkeypatch.setattr(RayPPOTrainer, "_load_checkpoint", loaded)
    cfg = harness.paper_config(tmp_path / "model")
    OmegaConf.update(cfg, "trainer.default_local_dir", str(tmp_path))
    assert cfg.trainer.val_before_train
    bare_trainer(cfg, total_training_steps=150, train_dataloader=range(10))._load_checkpoint()
    assert cfg.trainer.val_before_train is False


def test_verl_train_marks_the_run_preempted_and_exits_75_without_a_summary(tmp_path, monkeypatch):
    stop = preempt.Preempted(5, signal.SIGUSR1)
    marked = []
    monkeypatch.setattr(record, "open_run", lambda *a, **k: ("run-1", True))
    monkeypatch.setattr(record, "log_config", lambda *a, **k: {})
    monkeypatch.setattr(record, "mark_preempted", lambda *args: marked.append(args))
    monkeypatch.setattr(record, "finish_run", lambda *a, **k: pytest.fail("a preempted run was finished"))
    monkeypatch.setattr(checkpoint, "summarize_run", lambda *a, **k: pytest.fail("a preempted run exported"))
    monkeypatch.setattr(
        verl_train, "run_verl", lambda cfg: RayTaskError("run", "tb", stop).as_instanceof_cause()
    )
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"):  # train() sets them for verl: restored afterwards
        monkeypatch.setenv(name, "")
    spec = vc.compose_run("A", "method", 0)
    out = tmp_path / "run"
    cfg = vc.compose_verl_config(vc.run_overrides(spec, out, tmp_path / "data", tracking_uri="sqlite://"))
    assert verl_train.train(spec, cfg, out, "sqlite://", None, record.RunSpec()) == preempt.EXIT_PREEMPTED
    assert marked == [("run-1", 5, "SIGUSR1", "sqlite://")]
    assert not (out / "summary.json").exists()
