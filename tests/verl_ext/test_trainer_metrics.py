"""The trainer's read-outs: method.md §4 names of verl's metrics, mismatch/* from a step's batch,
health/alarm, the stock-engine guard, and MLflow continuity across a resume."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from commrl import tracking
from commrl.data.math_datasets import SPECS
from commrl.data.toy import ToyConfig, prepare_toy
from commrl.errors import ConfigError
from commrl.rl.config import HealthConfig
from commrl.rl.health import CollapseMonitor
from commrl.rl.mismatch import mismatch_metrics
from commrl.rl.reward import compute_score
from commrl.verl_ext.config import method_from_env
from commrl.verl_ext.engine import DENSE_REF_KEY
from commrl.verl_ext.engine import DENSE_REFERENCE as DENSE_REFERENCE_FLAG
from commrl.verl_ext.trainer import (
    CommrlPPOTrainer,
    StepChecks,
    batch_mismatch,
    kl_readout,
    logging_method_names,
    method_metrics,
)


def test_method_metrics_names_verls_metrics():
    verl_step = {
        "critic/score/mean": 0.7,
        "timing_s/step": 30.0,
        "timing_s/gen": 20.0,
        "timing_s/ref": 1.0,
        "timing_s/update_actor": 5.0,
        "actor/comm/bytes_total": 10.0,
        "actor/comm/ratio_vs_dense": 0.1,
        "actor/anchor/fire": 1.0,
        "val-core/commrl/math500/acc/mean@1": 0.6,
        "val-core/commrl/toy_arith/acc/mean@1": 0.4,
        "val-aux/commrl/math500/score/mean@1": 9.0,
        "actor/pg_loss": 0.3,
    }
    assert method_metrics(verl_step) == {
        "score/mean": 0.7,
        "time/step_s": 30.0,
        "time/sample_s": 20.0,
        "time/train_s": 6.0,
        "comm/bytes_total": 10.0,
        "comm/ratio_vs_dense": 0.1,
        "anchor/fire": 1.0,
        "val/acc": pytest.approx(0.5),
    }
    assert method_metrics({"actor/pg_loss": 1.0}) == {}


def test_sample_and_train_times_sum_the_timers_of_verls_fit():
    """``time/train_s`` is every trainer pass of the step, as the local driver's (old, reference, advantage,
    update), not ``timing_s/update_actor`` alone; ``time/sample_s`` generation and scoring. The timers are
    the ones ``RayPPOTrainer.fit`` opens (its source), their metrics ``compute_timing_metrics``'."""
    import inspect
    import re

    from verl.trainer.ppo.metric_utils import compute_timing_metrics
    from verl.trainer.ppo.utils import Role

    from commrl.verl_ext.trainer import TIMING_SUMS

    timers = set(re.findall(r'marked_timer\("(\w+)"', inspect.getsource(RayPPOTrainer.fit)))
    timers.add(str(Role.RefPolicy))  # fit names the reference pass's timer by its role
    for keys in TIMING_SUMS.values():
        assert {key.removeprefix("timing_s/") for key in keys} <= timers
    timing_raw = {
        "gen": 20.0,
        "reward": 0.5,
        "old_log_prob": 3.0,
        str(Role.RefPolicy): 2.0,
        "adv": 0.25,
        "update_actor": 5.0,
        "update_weights": 1.0,
        "save_checkpoint": 4.0,
        "step": 36.0,
    }
    ones = torch.ones(2, 5, dtype=torch.long)
    batch = DataProto.from_dict({"responses": ones[:, :3], "attention_mask": ones})
    named = method_metrics(compute_timing_metrics(batch, timing_raw))
    assert named["time/sample_s"] == 20.5
    assert named["time/train_s"] == 10.25  # update_actor alone: 5.0
    assert named["time/step_s"] == 36.0
    bypass = {k: v for k, v in timing_raw.items() if k != "old_log_prob"}  # bypass mode runs no old pass
    assert method_metrics(compute_timing_metrics(batch, bypass))["time/train_s"] == 7.25
    assert "time/train_s" not in method_metrics({"timing_s/testing": 9.0})  # a validation-only log


@pytest.mark.parametrize("n", [1, 2])
def test_val_acc_from_verls_validation_metric_names(n):
    """verl's own validation keys (``process_validation_metrics`` via ``RayPPOTrainer._val_metrics_update``,
    as ``_validate`` builds them; ``val_kwargs.n = n`` samples per prompt) on rows of commrl's data stage
    (the toy task's ``commrl/toy_arith``, MATH500's ``commrl/math500``) scored by commrl's reward."""
    toy = prepare_toy(ToyConfig(n_train=4, n_validation=4, n_test=4)).splits["validation"]
    math500 = [
        {"data_source": SPECS["math500"].data_source, "reward_model": {"ground_truth": "\\frac{1}{2}"}}
    ] * 2
    rows = [(row, i < 2) for i, row in enumerate(toy)] + [(row, True) for row in math500]  # toy 1/2, math 1
    sources, uids, infos = [], [], {"reward": [], "score": [], "acc": []}
    for i, (row, right) in enumerate(rows):
        truth = row["reward_model"]["ground_truth"]
        response = f"\\boxed{{{truth}}}" if right else "\\boxed{-1}"
        for _ in range(n):  # test_batch.repeat(n, interleave=True)
            result = compute_score(row["data_source"], response, truth)
            infos["reward"].append(result["score"])
            for key, value in result.items():
                infos[key].append(value)
            sources.append(row["data_source"])
            uids.append(f"uid{i}")
    trainer = object.__new__(CommrlPPOTrainer)  # _val_metrics_update reads nothing of the trainer
    sources = np.array(sources, dtype=object)
    verl_metrics = RayPPOTrainer._val_metrics_update(trainer, sources, uids, infos, [])
    assert f"val-core/commrl/toy_arith/acc/mean@{n}" in verl_metrics
    assert method_metrics(verl_metrics)["val/acc"] == pytest.approx((0.5 + 1.0) / 2)


def _responses(mask: torch.Tensor, prompt: int = 2) -> dict[str, torch.Tensor]:
    """``responses`` and ``attention_mask`` (a left prompt of ``prompt`` tokens) whose response part is
    ``mask``: what verl's ``compute_response_mask`` reads."""
    attention = torch.cat([torch.ones(mask.shape[0], prompt, dtype=mask.dtype), mask], dim=1)
    return {"responses": torch.zeros_like(mask), "attention_mask": attention, "response_mask": mask.clone()}


def test_batch_mismatch_reads_sampler_against_trainer():
    """Equal log-probs: correlation 1, no gap, none clipped; a 2x ratio on 3 of 5 tokens: clipped at eps."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    lp = torch.tensor([[-0.1, -2.0, -0.5, 0.0], [-1.0, -0.3, 0.0, 0.0]])
    batch = DataProto.from_dict(
        tensors=dict(rollout_log_probs=lp, old_log_probs=lp.clone(), **_responses(mask))
    )
    same = batch_mismatch(batch)
    assert same["mismatch/logprob_corr"] == pytest.approx(1.0) and same["mismatch/prob_gap"] == 0.0
    assert same["mismatch/async_clip_frac_eps0.2"] == 0.0
    shifted = lp.clone()
    shifted[0, :3] += torch.log(torch.tensor(2.0))
    batch.batch["old_log_probs"] = shifted
    moved = batch_mismatch(batch)
    assert moved["mismatch/async_clip_frac_eps0.2"] == pytest.approx(3 / 5)
    assert moved["mismatch/async_clip_frac_5x"] == 0.0
    assert batch_mismatch(DataProto.from_dict(tensors=dict(old_log_probs=lp, response_mask=mask))) == {}


def test_batch_mismatch_reads_every_valid_token_after_verls_rejection():
    """verl's decoupled rejection (its own ``compute_rollout_correction_and_add_to_batch``) replaces
    ``response_mask`` by the sequences it kept; the mismatch is still read on every valid token, as the local
    driver reads it, not on the kept ones (the least mismatched: every one rejected read corr 1)."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    gen = torch.Generator().manual_seed(0)
    sampler = torch.randn(8, 6, generator=gen) * 0.5 - 1.0
    shift = torch.tensor([0.0, 0.1, 0.2, 1.5, 2.0, 2.5, 3.0, 3.5]).unsqueeze(-1)  # rows far off the sampler
    old = sampler - shift + torch.randn(8, 6, generator=gen) * 0.3
    mask = torch.ones(8, 6, dtype=torch.long)
    batch = DataProto.from_dict(
        tensors=dict(old_log_probs=old, rollout_log_probs=sampler, **_responses(mask))
    )
    config = RolloutCorrectionConfig(
        rollout_is=None, rollout_rs="seq_mean_k1", rollout_rs_threshold="0.5_2.0"
    )
    batch, _ = compute_rollout_correction_and_add_to_batch(batch, config)
    assert batch.batch["response_mask"].sum() < mask.sum()  # verl rejected some sequences
    assert batch_mismatch(batch) == pytest.approx(mismatch_metrics(sampler, old, mask))


def test_kl_readout_reads_every_valid_token_after_verls_rejection(cpu_verl, tiny_model_dir):
    """``actor/kl_loss`` after verl's decoupled rejection (its own
    ``compute_rollout_correction_and_add_to_batch``): the old pass against the reference over every valid
    token (the pair's estimator and aggregation), as the local driver reads it, not over the kept ones."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    gen = torch.Generator().manual_seed(0)
    sampler = torch.randn(8, 6, generator=gen) * 0.5 - 1.0
    shift = torch.tensor([0.0, 0.1, 0.2, 1.5, 2.0, 2.5, 3.0, 3.5]).unsqueeze(-1)  # rows far off the sampler
    old = sampler - shift + torch.randn(8, 6, generator=gen) * 0.3
    mask = torch.ones(8, 6, dtype=torch.long)
    mask[0, 4:] = 0
    batch = DataProto.from_dict(
        tensors=dict(old_log_probs=old, rollout_log_probs=sampler, ref_log_prob=sampler, **_responses(mask))
    )
    config = RolloutCorrectionConfig(
        rollout_is=None, rollout_rs="seq_mean_k1", rollout_rs_threshold="0.5_2.0"
    )
    batch, _ = compute_rollout_correction_and_add_to_batch(batch, config)
    assert 0 < batch.batch["response_mask"].sum() < mask.sum()  # verl rejected some sequences
    actor = cpu_verl.paper_config(tiny_model_dir).actor_rollout_ref.actor
    kld = core_algos.kl_penalty(old, sampler, actor.kl_loss_type)
    want = core_algos.agg_loss(loss_mat=kld, loss_mask=mask.bool(), loss_agg_mode=actor.loss_agg_mode)
    assert kl_readout(batch, actor, old) == pytest.approx(float(want), rel=1e-6)


def update_metrics(step: int) -> dict:
    """One actor update's metrics in verl's names and shapes (per-mini-batch lists, ``actor/`` prefix) plus
    ``mismatch/*``: a healthy window, then a KL that climbs by 1 nat per tick."""
    window = HealthConfig().window
    kl = 0.01 if step <= window else float(step - window)
    return {
        "actor/kl_loss": [kl, kl],
        "actor/pg_clipfrac": [0.01, 0.03],
        "actor/pg_loss": [0.1, 0.2],
        "actor/comm/bytes_total": [1.0],
        "mismatch/logprob_corr": 0.95,
    }


def test_health_alarm_from_verl_metric_names(tmp_path):
    """``StepChecks`` feeds verl's per-step names to the local driver's ``CollapseMonitor``: the same
    alarms as the monitor on the step means; the state survives a save/load (a resume) unchanged."""
    steps = range(1, 2 * HealthConfig().window + 1)
    local = CollapseMonitor(HealthConfig())
    want = [
        float(bool(local.update({k: float(np.mean(v)) for k, v in update_metrics(s).items()}))) for s in steps
    ]
    assert want[0] == 0.0 and 1.0 in want

    checks = StepChecks(None, HealthConfig())
    got = []
    for step in steps:
        metrics = update_metrics(step)
        checks.after_update(metrics, step)
        got.append(metrics["health/alarm"])
        if step == 7:  # a checkpoint, then a fresh TaskRunner resuming from it
            checks.save(tmp_path / "global_step_7")
            checks = StepChecks(None, HealthConfig())
            checks.load(tmp_path / "global_step_7")
    assert got == want


def trainer_around(cfg, worker) -> CommrlPPOTrainer:
    """``CommrlPPOTrainer`` driving an in-process worker as its actor worker group. ``__init__`` is skipped
    (it builds Ray resource pools and dataloaders); ``_update_actor`` is verl's, then commrl's."""
    trainer = object.__new__(CommrlPPOTrainer)
    trainer.config, trainer.actor_rollout_wg, trainer.global_steps = cfg, worker, 1
    trainer.checks = StepChecks(method_from_env(), HealthConfig())
    return trainer


def trainer_batch(cpu_verl, worker) -> DataProto:
    """The harness's rollout batch with the trainer's old log-probs; the sampler's equal to them."""
    batch = cpu_verl.training_batch(worker)
    batch.batch["old_log_probs"] = cpu_verl.log_probs(worker, batch)
    batch.batch["rollout_log_probs"] = batch.batch["old_log_probs"].clone()
    return batch


def test_update_actor_adds_health_and_mismatch(cpu_verl, tiny_model_dir, method):
    """Through verl's ``RayPPOTrainer._update_actor`` (two mini-batches) with commrl's engine: health/alarm,
    mismatch/* and the engine's comm/* come out beside verl's actor/* names."""
    cfg = cpu_verl.paper_config(tiny_model_dir, extra=cpu_verl.engine_test_shapes())
    method(codec="lowrank", cadence=2)
    worker = cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "commrl")
    trainer = trainer_around(cfg, worker)
    metrics = trainer._update_actor(trainer_batch(cpu_verl, worker)).meta_info["metrics"]
    assert metrics["health/alarm"] == 0.0
    assert metrics["mismatch/logprob_corr"] == pytest.approx(1.0)
    assert len(metrics["actor/pg_loss"]) == 2 and metrics["actor/comm/bytes_total"]
    assert isinstance(metrics["actor/kl_loss"], float)  # step 1 fires: the batch's read-out, not verl's list


def test_fire_step_adds_the_dense_reference_and_logs_the_codec_kl(cpu_verl, tiny_model_dir, method):
    """Through verl's ``_compute_ref_log_prob`` (codec reference worker): a fire step (global step 1 = tick 0)
    adds the dense reference, the stock engine's log-probs; a fast step adds none. The fire step's
    ``actor/kl_loss`` is the old pass against the codec reference over the batch, as on other ticks."""
    from verl.trainer.ppo import core_algos

    from commrl.verl_ext.engine import DENSE_REF_KEY

    cfg = cpu_verl.paper_config(tiny_model_dir, extra=cpu_verl.engine_test_shapes())
    method(codec="lowrank", cadence=2)
    worker = cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "commrl")
    ref_worker = cpu_verl.build_worker(cfg.actor_rollout_ref, "ref", "commrl")
    stock_ref = cpu_verl.build_worker(cfg.actor_rollout_ref, "ref", "stock")
    trainer = trainer_around(cfg, worker)
    trainer.ref_policy_wg, trainer.ref_in_actor = ref_worker, False
    batch = trainer_batch(cpu_verl, worker)
    for key in ("ref_log_prob", DENSE_REF_KEY):
        batch.batch.pop(key)

    trainer.global_steps = 2  # tick 1: no fire
    assert DENSE_REF_KEY not in trainer._compute_ref_log_prob(batch).batch.keys()  # noqa: SIM118
    trainer.global_steps = 1
    ref = trainer._compute_ref_log_prob(batch)
    assert DENSE_REFERENCE_FLAG not in batch.meta_info
    assert torch.equal(ref.batch["ref_log_prob"], cpu_verl.log_probs(ref_worker, batch, ref=True))
    dense = cpu_verl.log_probs(stock_ref, batch, ref=True)
    assert torch.equal(ref.batch[DENSE_REF_KEY], dense)
    assert not torch.equal(ref.batch["ref_log_prob"], dense)

    batch = batch.union(ref)
    metrics = trainer._update_actor(batch).meta_info["metrics"]
    actor = cfg.actor_rollout_ref.actor
    mask = batch.batch["response_mask"].bool()
    kld = core_algos.kl_penalty(batch.batch["old_log_probs"], batch.batch["ref_log_prob"], actor.kl_loss_type)
    want = core_algos.agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=actor.loss_agg_mode)
    assert metrics["actor/kl_loss"] == pytest.approx(float(want), rel=1e-6)


def test_a_fast_step_logs_the_kl_read_out_not_verls_training_kl(cpu_verl, tiny_model_dir, method):
    """A fast step (tick 1 at cadence 2) through verl's ``_update_actor`` with two mini-batches: verl's
    ``actor/kl_loss`` is its training loss's KL term per mini-batch, the second at weights the first moved
    (and, for the ``dropout`` condition, with the training pass's dropout); commrl logs the local driver's
    read-out instead, the old pass against the codec reference over every valid token."""
    from verl.trainer.ppo import core_algos

    cfg = cpu_verl.paper_config(tiny_model_dir, extra=cpu_verl.engine_test_shapes())
    method(codec="lowrank", cadence=2)
    worker = cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "commrl")
    trainer = trainer_around(cfg, worker)
    plain_worker = cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "commrl")
    plain_trainer = trainer_around(cfg, plain_worker)
    for t in (trainer, plain_trainer):
        t.global_steps = 1  # tick 0 fires: train through it, so that the next step is a fast one
        t._update_actor(trainer_batch(cpu_verl, t.actor_rollout_wg))
        t.global_steps = 2
    batch = trainer_batch(cpu_verl, worker)
    batch.batch.pop(DENSE_REF_KEY)
    old = batch.batch["old_log_probs"]
    noise = torch.randn(old.shape, generator=torch.Generator().manual_seed(0))
    batch.batch["ref_log_prob"] = old + 0.2 * noise
    plain_trainer.checks.method = None
    verls = RayPPOTrainer._update_actor(plain_trainer, copy.deepcopy(batch)).meta_info["metrics"]
    metrics = trainer._update_actor(batch).meta_info["metrics"]
    assert len(verls["actor/kl_loss"]) == 2 and verls["actor/kl_loss"][0] != verls["actor/kl_loss"][1]
    actor = cfg.actor_rollout_ref.actor
    kld = core_algos.kl_penalty(batch.batch["old_log_probs"], batch.batch["ref_log_prob"], actor.kl_loss_type)
    mask = batch.batch["response_mask"].bool()
    want = core_algos.agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=actor.loss_agg_mode)
    assert metrics["actor/kl_loss"] == pytest.approx(float(want), rel=1e-6)


def test_method_on_the_stock_engine_fails_at_the_first_tick(cpu_verl, tiny_model_dir, method):
    """COMMRL_METHOD says lowrank but verl built its stock engine (as on a non-NVIDIA platform): the first
    update raises instead of training dense."""
    cfg = cpu_verl.paper_config(tiny_model_dir, extra=cpu_verl.engine_test_shapes())
    method(codec="lowrank", cadence=2)
    worker = cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "stock")
    trainer = trainer_around(cfg, worker)
    with pytest.raises(ConfigError, match=r"stock engine.*external_lib=commrl\.verl_ext"):
        trainer._update_actor(trainer_batch(cpu_verl, worker))


def test_resume_with_more_ticks_keeps_logging_to_mlflow(tmp_path, monkeypatch):
    """verl's ``Tracking`` as ``fit`` builds it, on the run of MLFLOW_RUN_ID: a resume whose config changed
    (more ticks) still logs its steps, and the change is recorded (verl's own set-up drops its MLflow
    backend there: params are immutable)."""
    import mlflow
    import verl.utils.tracking as verl_tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = tracking.client(uri)
    run_id = client.create_run(client.create_experiment("commrl/A")).info.run_id
    config = {"trainer": {"total_training_steps": 2, "logger": ["console", "mlflow"]}}
    try:
        for ticks, steps in (
            (2, (1, 2)),
            (4, (3, 4)),
        ):  # a run, then its resume to 4 ticks (a new TaskRunner)
            monkeypatch.setenv("MLFLOW_RUN_ID", run_id)  # as verl-train sets it (mlflow.end_run unsets it)
            config = copy.deepcopy(config)
            config["trainer"]["total_training_steps"] = ticks
            with logging_method_names():
                logger = verl_tracking.Tracking("commrl/A", "A/method/seed0", ["console", "mlflow"], config)
                for step in steps:
                    logger.log({"critic/score/mean": 0.1 * step, "actor/pg_loss": 1.0}, step=step)
                logger.finish()
    finally:
        mlflow.set_tracking_uri(None)  # Tracking set mlflow's process-wide store to this test's
    history = client.get_metric_history(run_id, "score/mean")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]
    run = client.get_run(run_id)
    assert run.data.params["trainer/total_training_steps"] == "2"
    assert run.data.tags["config_changed"] == "trainer/total_training_steps"
