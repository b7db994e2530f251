"""A resume re-validates a checkpoint whose validation a hard kill lost: verl 0.9.1's ``fit`` saves a
``save_freq`` step before it validates and logs it, and the paper pairs validate only on save steps.

verl's real ``RayPPOTrainer.fit`` and ``_load_checkpoint`` run here on CPU, logging into a real MLflow run
(sqlite) through commrl's ``Tracking``. What needs a GPU is stubbed: the actor worker group's
``load_checkpoint``, the rollout's weight sync (``checkpoint_manager``) and ``_validate`` (vLLM sampling),
which returns verl's own validation metric name; the train loader stops ``fit`` at its first batch.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from commrl import tracking
from commrl.cli import verl_train
from commrl.rl.config import HealthConfig
from commrl.run import record
from commrl.verl_ext import checkpoint
from commrl.verl_ext import config as vc
from commrl.verl_ext.checkpoint import TRACKER
from commrl.verl_ext.config import on_schedule
from commrl.verl_ext.trainer import CommrlPPOTrainer, StepChecks

VERL_VAL = "val-core/commrl/math500/acc/mean@1"  # verl's name (its MLflow adapter writes @ as _at_)
TOTAL = 150  # pair A, method: 150 ticks, trainer.test_freq = trainer.save_freq = 25


class TrainingStarted(Exception):
    """The train loader was iterated: ``fit`` went on to train."""


class Loader:
    """verl's train loader, as far as ``fit`` and ``_load_checkpoint`` use it before the first batch."""

    def __len__(self) -> int:
        return 1000

    def __iter__(self):
        raise TrainingStarted


def save_step(folder: Path, step: int) -> None:
    """verl's checkpoint of ``step`` as its tracker names it (the actor's shards are the stub's)."""
    (folder / f"global_step_{step}" / "actor").mkdir(parents=True, exist_ok=True)
    (folder / TRACKER).write_text(str(step))


@pytest.fixture
def mlflow_run(tmp_path, monkeypatch):
    """A run in a sqlite store, as ``commrl verl-train`` hands it to verl (``MLFLOW_RUN_ID``); its id."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.client(uri)
    run_id = client.create_run(client.create_experiment("commrl/A")).info.run_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    yield run_id
    mlflow.end_run()
    mlflow.set_tracking_uri(None)  # attach_mlflow set mlflow's process-wide store to this test's


def history(run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in tracking.client().get_metric_history(run_id, key)}


def resumed_trainer(tmp_path: Path, step: int, extra: tuple[str, ...] = ()) -> tuple[CommrlPPOTrainer, list]:
    """``CommrlPPOTrainer`` on the paper config of pair A (method), its checkpoints at ``step``, the
    GPU-side worker groups stubbed; and the list of steps ``_validate`` ran at."""
    import verl_cpu_harness as harness

    cfg = harness.paper_config(tmp_path / "model", extra=extra)
    folder = tmp_path / "checkpoints"
    OmegaConf.update(cfg, "trainer.default_local_dir", str(folder))
    save_step(folder, step)
    trainer = object.__new__(CommrlPPOTrainer)
    validated: list[int] = []

    def validate() -> dict[str, float]:
        validated.append(trainer.global_steps)
        return {VERL_VAL: 0.5}

    trainer.config, trainer.use_critic, trainer.total_training_steps = cfg, False, TOTAL
    trainer.checks = StepChecks(None, HealthConfig())
    trainer.actor_rollout_wg = SimpleNamespace(load_checkpoint=lambda path, del_local_after_load=False: None)
    trainer.checkpoint_manager = SimpleNamespace(update_weights=lambda step: None)
    trainer.train_dataloader = Loader()
    trainer._validate = validate
    trainer._init_dump_executor()
    return trainer, validated


@pytest.mark.parametrize(
    ("step", "logged", "want"),
    [
        (25, [0], [25]),  # killed during step 25's validation: validated at 25 before training
        (25, [0, 25], []),  # step 25's validation is in the run: not a second time
        (30, [0, 25], []),  # a preemption save at 30: no validation was due there
    ],
)
def test_a_resume_validates_the_loaded_step_when_its_val_acc_is_missing(
    tmp_path, mlflow_run, step, logged, want
):
    client = tracking.client()
    for s in logged:
        client.log_metric(mlflow_run, "val/acc", 0.25, step=s)
    trainer, validated = resumed_trainer(tmp_path, step)
    assert trainer.config.trainer.val_before_train and trainer.config.trainer.test_freq == 25
    with pytest.raises(TrainingStarted):
        trainer.fit()
    assert validated == want
    assert sorted(history(mlflow_run, "val/acc")) == sorted({*logged, *want})
    assert sorted(history(mlflow_run, VERL_VAL.replace("@", "_at_"))) == want
    assert history(mlflow_run, "val/acc").get(step) == (0.5 if want else 0.25 if step in logged else None)


def test_val_only_validates_the_last_checkpoint_and_trains_nothing(tmp_path, mlflow_run):
    """``commrl verl-train`` on a run at its last tick whose validation a kill lost (``trainer.val_only``)."""
    trainer, validated = resumed_trainer(tmp_path, TOTAL, extra=("trainer.val_only=true",))
    trainer.fit()  # returns without iterating the train loader
    assert validated == [TOTAL]
    assert history(mlflow_run, "val/acc") == {TOTAL: 0.5}
    assert history(mlflow_run, VERL_VAL.replace("@", "_at_")) == {TOTAL: 0.5}


def test_on_schedule_follows_verls_fit():
    assert [s for s in range(1, 92) if on_schedule(s, 25, 90)] == [25, 50, 75, 90, 91]
    assert not on_schedule(100, 0, 100)


@pytest.mark.parametrize(("logged", "validates"), [([0, 25, 50, 75], True), ([0, 25, 50, 75, 100], False)])
def test_verl_train_at_its_last_tick_validates_it_when_its_val_acc_is_missing(
    tmp_path, monkeypatch, logged, validates
):
    """A rerun whose checkpoints reach its ticks: verl runs validation-only when the last checkpoint's
    val/acc is missing (else nothing); the summary then has val/acc at the read point."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"):  # train() sets them for verl: restored afterwards
        monkeypatch.setenv(name, "")
    monkeypatch.setattr(checkpoint, "export_hf", lambda d, t, target: Path(target))
    spec = vc.compose_run("A", "no_projection", 0)  # ticks 100, read_at 100
    out = tmp_path / "run"
    run_id, _ = record.open_run(verl_train.identity(spec, spec.ticks), out, uri)
    for s in logged:
        tracking.client(uri).log_metric(run_id, "val/acc", 0.25, step=s)
    cfg = vc.compose_verl_config(vc.run_overrides(spec, out, tmp_path / "data", tracking_uri=uri))
    for s in (25, 50, 75, 100):
        save_step(Path(cfg.trainer.default_local_dir), s)
    runs = []

    def run_verl(cfg) -> None:  # verl's val_only pass, as the test above runs it: val/acc at the step
        runs.append(bool(cfg.trainer.val_only))
        tracking.client(uri).log_metric(run_id, "val/acc", 0.5, step=100)

    monkeypatch.setattr(verl_train, "run_verl", run_verl)
    assert verl_train.train(spec, cfg, out, uri, run_id, record.RunSpec()) == 0
    assert runs == ([True] if validates else [])
    summary = checkpoint.summarize_run(out, spec, spec.ticks, run_id, uri)
    assert summary.complete and spec.read_at in summary.val_acc


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_at_an_epochs_end_draws_the_uninterrupted_runs_next_epoch(tmp_path, mlflow_run, workers):
    """verl's train loader (``create_rl_sampler``'s seeded sampler, torchdata's ``StatefulDataLoader``): a run
    checkpointed at the end of epoch 0 (verl saves ``data.pt`` after the step's batch) and resumed there
    draws epoch 1 in the uninterrupted run's order, not epoch 0's again (verl 0.9.1's own load skips the
    state there); a resume mid-epoch is verl's own restore, left as it is."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_sampler

    def loader() -> StatefulDataLoader:
        rows = list(range(12))
        sampler = create_rl_sampler(OmegaConf.create({"shuffle": True, "seed": 7}), rows)
        return StatefulDataLoader(rows, batch_size=3, drop_last=True, sampler=sampler, num_workers=workers)

    def epoch(dl) -> list[int]:
        return [i for batch in dl for i in batch.tolist()]

    uninterrupted, states = loader(), {}
    orders = []
    for _ in range(2):
        order = []
        for batch in uninterrupted:
            order += batch.tolist()
            states[len(states) + 1] = uninterrupted.state_dict()  # verl's _save_checkpoint of that step
        orders.append(order)
    assert orders[0] != orders[1]
    for step, want in ((4, orders[1]), (6, orders[1][6:])):  # epoch 0's end; mid-epoch 1
        trainer, _ = resumed_trainer(tmp_path / str(step), step)
        folder = checkpoint.step_dir(Path(trainer.config.trainer.default_local_dir), step)
        torch.save(states[step], folder / checkpoint.LOADER_STATE)
        trainer.train_dataloader = loader()
        trainer._load_checkpoint()
        assert trainer.global_steps == step
        assert epoch(trainer.train_dataloader) == want
