"""Rollout correction on the verl driver (issue 15): ``rl.*`` of the condition tree become verl's
``algorithm.rollout_correction.*`` (and, in bypass mode, the workers' policy loss), the asynchronous
conditions are refused naming why, and verl's own loss in the commrl engine honours the IS weights and the
rejection mask (``actor/effective_token_frac``)."""

from __future__ import annotations

import copy
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.utils.config import omega_conf_to_dataclass

from commrl.cli.main import main
from commrl.errors import ConfigError
from commrl.rl.config import HealthConfig, RLConfig
from commrl.rl.correction import RolloutCorrection
from commrl.verl_ext import config as vc
from commrl.verl_ext.trainer import CommrlPPOTrainer, StepChecks, method_metrics

REPO = Path(__file__).resolve().parents[2]
ASYNC_CONDITIONS = (
    "dense_async",
    "method_async",
    "method_async_tis",
    "method_async_icepop",
    "method_async_seq_rs",
    "dense_async_tis",
)
# a synchronous corrected run: bypass mode with sequence-level geometric-mean rejection
SYNC_CORRECTED = (
    "rl.behaviour_logprobs=sampler",
    "rl.rollout_correction.rollout_rs=seq_mean_k1",
    "rl.rollout_correction.rollout_rs_threshold=0.5_2.0",
)
DENSE = dict(codec="identity", grad_codec="none", anchor=False, projection="none")


def resolve(condition: str, commrl=(), extra=(), config_dir: Path | None = None, pair: str = "A"):
    """verl's config of (pair, condition) as ``commrl verl-train --dry-run`` composes it."""
    spec = vc.compose_run(pair, condition, 0, commrl, config_dir)
    overrides = vc.run_overrides(
        spec, Path("/runs/x"), Path("/data"), tracking_uri="sqlite:///m.db", extra=extra
    )
    return spec, vc.compose_verl_config(overrides)


def condition_block(condition: str) -> dict:
    return yaml.safe_load((REPO / "configs" / "condition" / f"{condition}.yaml").read_text())


@pytest.mark.parametrize("condition", ASYNC_CONDITIONS)
def test_async_conditions_are_refused_on_verl_naming_why(condition):
    with pytest.raises(ConfigError) as err:
        vc.compose_run("A", condition, 0)
    message = str(err.value)
    assert f"condition {condition!r} does not run on the verl driver: rl.staleness 1" in message
    assert "synchronous" in message and message.endswith("run it with `commrl train`")


@pytest.mark.parametrize("condition", ASYNC_CONDITIONS)
def test_each_async_condition_translates_but_for_its_staleness(condition, tmp_path):
    """Without its unsupported_drivers entry the condition still fails, on rl.staleness itself; at
    staleness 0 its behaviour log-probs and correction resolve into verl's keys, which verl's
    RolloutCorrectionConfig accepts, and bypass mode reaches the workers' policy loss."""
    shutil.copytree(REPO / "configs" / "verl", tmp_path / "verl")
    shutil.copytree(REPO / "configs" / "condition", tmp_path / "condition")
    block = condition_block(condition)
    del block["unsupported_drivers"]
    (tmp_path / "condition" / f"{condition}.yaml").write_text("# @package _global_\n" + yaml.safe_dump(block))
    with pytest.raises(
        ConfigError, match=r"^rl\.staleness=1 is not supported by the verl driver: .*synchronous"
    ):
        vc.compose_run("A", condition, 0, config_dir=tmp_path / "verl")

    _, cfg = resolve(condition, ["rl.staleness=0"], config_dir=tmp_path / "verl")
    rl = block["rl"]
    bypass = rl["behaviour_logprobs"] == "sampler"
    want = RolloutCorrection(**rl.get("rollout_correction", {})).to_verl(bypass)
    assert vc.check_rollout_correction(cfg) == want
    policy_loss = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss
    assert policy_loss.loss_mode == ("bypass_mode" if bypass else "vanilla")
    if bypass:
        assert policy_loss.rollout_correction == want
    vc.check_verl_config(cfg)


def test_sync_corrected_condition_dry_runs_into_verls_keys(tmp_path, monkeypatch, capsys):
    """``commrl verl-train --dry-run`` with rl.* on the command line prints verl's config with them."""
    monkeypatch.setenv("COMMRL_RESULTS", str(tmp_path))
    argv = ["verl-train", "--pair", "A", "--condition", "method", "--out", str(tmp_path / "run"), "--dry-run"]
    assert main([*argv, *SYNC_CORRECTED]) == 0
    cfg = OmegaConf.create(yaml.safe_load(capsys.readouterr().out))
    want = dict(
        rollout_is=None,
        rollout_is_threshold=2.0,
        rollout_is_batch_normalize=False,
        rollout_rs="seq_mean_k1",
        rollout_rs_threshold="0.5_2.0",
        bypass_mode=True,
        loss_type="ppo_clip",
    )
    assert OmegaConf.to_container(cfg.algorithm.rollout_correction) == want
    assert omega_conf_to_dataclass(cfg.algorithm.rollout_correction, RolloutCorrectionConfig) == (
        RolloutCorrectionConfig(**want)
    )
    # verl's trainer switches the loss only in its own process; the workers get it from the config
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "bypass_mode"
    worker_loss = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss
    assert worker_loss.rollout_correction == RolloutCorrectionConfig(**want)
    assert not (tmp_path / "run").exists()


def test_tree_defaults_are_the_local_drivers_and_change_nothing():
    """configs/verl's rl: block = RLConfig's defaults; a run without rl.* keeps verl's own defaults."""
    tree = yaml.safe_load((REPO / "configs" / "verl" / "config.yaml").read_text())
    local = RLConfig()
    assert tree["rl"] == {
        "staleness": local.staleness,
        "behaviour_logprobs": local.behaviour_logprobs,
        "rollout_correction": asdict(local.rollout_correction),
    }
    _, cfg = resolve("method")
    stock = vc.compose_verl_config([])
    assert cfg.algorithm.rollout_correction == stock.algorithm.rollout_correction
    assert cfg.actor_rollout_ref.actor.policy_loss == stock.actor_rollout_ref.actor.policy_loss


@pytest.mark.parametrize(
    ("commrl", "extra", "message"),
    [
        (
            ["rl.rollout_correction.rollout_is=token", "rl.rollout_correction.rollout_is_threshold=-1"],
            [],
            "rl.rollout_correction.rollout_is_threshold=-1: ",
        ),
        (["rl.rollout_correction.rollout_is=tokens"], [], "rl.rollout_correction.rollout_is='tokens' is not"),
        (
            ["rl.rollout_correction.rollout_rs=seq_mean_k9"],
            [],
            "rl.rollout_correction.rollout_rs='seq_mean_k9'",
        ),
        (["+rl.rollout_correction.bypass_mode=true"], [], "bypass_mode is rl.behaviour_logprobs=sampler"),
        (
            ["rl.behaviour_logprobs=rollout"],
            [],
            "rl.behaviour_logprobs='rollout' is not one of trainer, sampler",
        ),
        (["rl.staleness=2"], [], "rl.staleness=2 is not supported by the verl driver"),
        (["+rl.lr=0.1"], [], "rl.lr is not read by the verl driver"),
        (
            [],
            ["algorithm.rollout_correction.rollout_is=token"],
            "set rl.rollout_correction.rollout_is instead",
        ),
        ([], ["algorithm.rollout_correction.bypass_mode=true"], "set rl.behaviour_logprobs=sampler instead"),
    ],
)
def test_bad_correction_settings_are_named(commrl, extra, message):
    with pytest.raises(ConfigError) as err:
        resolve("method", commrl, extra)
    assert message in str(err.value)


def test_a_correction_without_the_samplers_log_probs_is_refused():
    """verl's trainer skips a decoupled correction silently when the sampler recorded no log-probs."""
    _, cfg = resolve("method", SYNC_CORRECTED[1:], ["actor_rollout_ref.rollout.calculate_log_probs=false"])
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.calculate_log_probs=false"):
        vc.check_verl_config(cfg)
    _, plain = resolve("method", extra=["actor_rollout_ref.rollout.calculate_log_probs=false"])
    vc.check_verl_config(plain)  # no correction: nothing needs them


def test_bypass_loss_read_outs_are_logged_under_verls_trainer_names():
    """verl's bypass loss returns rollout_corr/* from the workers (actor/rollout_corr/*); the decoupled
    trainer's own rollout_corr/* are never shadowed."""
    assert method_metrics({"actor/rollout_corr/kl": 0.1, "actor/pg_loss": 1.0}) == {"rollout_corr/kl": 0.1}
    assert method_metrics({"actor/rollout_corr/kl": 0.1, "rollout_corr/kl": 0.2}) == {}


# -- verl's loss in the commrl engine ------------------------------------------------------------------------
def worker_config(cpu_verl, model_dir: Path, commrl):
    """The paper pair's resolved config with ``commrl`` (rl.*), on the tiny model and the engine tests'
    shapes; one optimizer step per update (so the update's pass runs at the old pass's weights)."""
    spec = vc.compose_run("A", "dense", 0, commrl)
    where = Path("/tmp/commrl-harness")
    overrides = vc.run_overrides(spec, where / "run", where / "data", tracking_uri="sqlite:///m.db")
    return vc.compose_verl_config(
        [
            *overrides,
            *cpu_verl.cpu_overrides(model_dir),
            *cpu_verl.engine_test_shapes(),
            f"actor_rollout_ref.actor.ppo_mini_batch_size={cpu_verl.N_PROMPTS}",
        ]
    )


def trainer_around(cfg, worker) -> CommrlPPOTrainer:
    trainer = object.__new__(CommrlPPOTrainer)
    trainer.config, trainer.actor_rollout_wg, trainer.global_steps = cfg, worker, 1
    trainer.checks = StepChecks(None, HealthConfig())
    return trainer


def sampled_batch(cpu_verl, worker, log_ratio):
    """The harness batch with the trainer's log-probs and the sampler's at ``log_ratio`` below them
    (``log_ratio(row, length) -> (length,)``), and token-level rewards as verl's reward step leaves them."""
    batch = cpu_verl.training_batch(worker)
    trainer_lp = cpu_verl.log_probs(worker, batch)
    mask = batch.batch["response_mask"]
    rollout = trainer_lp.clone()
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        rollout[i, :n] -= log_ratio(i, n)
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(mask.shape[0]), mask.sum(-1) - 1] = batch.batch["scores"]
    batch.batch["token_level_rewards"] = rewards
    batch.batch["rollout_log_probs"] = rollout
    del batch.batch["advantages"]  # verl computes them after the correction
    return batch, trainer_lp


def advantages(batch, cfg) -> None:
    from verl.trainer.ppo.ray_trainer import compute_advantage

    compute_advantage(batch, adv_estimator="grpo", num_repeat=cfg.actor_rollout_ref.rollout.n)


REJECTED = {1, 6, 11, 12}  # rows whose sampler ratio is 3 on every token (geometric mean 3 > 2)


def test_decoupled_icepop_and_rejection_reach_verls_loss(cpu_verl, tiny_model_dir, method):
    """Decoupled mode, as verl's fit runs it: its helper masks the rejected sequences and zeroes IcePop's
    out-of-band weights before the advantages; the engine's update counts exactly the other eligible tokens
    as carrying gradient (ratio 1: nothing clipped), and the rejected ones as eligible."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    commrl = [
        "rl.rollout_correction.rollout_is=token",
        "rl.rollout_correction.rollout_is_threshold=0.5_5.0",
        "rl.rollout_correction.rollout_rs=seq_mean_k1",
        "rl.rollout_correction.rollout_rs_threshold=0.5_2.0",
    ]
    cfg = worker_config(cpu_verl, tiny_model_dir, commrl)
    method(**DENSE)
    worker = cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "commrl")

    def log_ratio(row, n):  # rejected rows: 3 everywhere; others: one token at 6 (outside IcePop's band)
        r = torch.zeros(n)
        r[:] = torch.log(torch.tensor(3.0)) if row in REJECTED else 0.0
        if row not in REJECTED:
            r[row % n] = torch.log(torch.tensor(6.0))
        return r

    batch, trainer_lp = sampled_batch(cpu_verl, worker, log_ratio)
    batch.batch["old_log_probs"] = trainer_lp
    valid = batch.batch["response_mask"].bool().clone()
    pre = copy.deepcopy(batch)
    advantages(pre, cfg)
    eligible = valid & (pre.batch["advantages"] != 0)

    batch, corr_metrics = compute_rollout_correction_and_add_to_batch(batch, cfg.algorithm.rollout_correction)
    advantages(batch, cfg)
    kept = batch.batch["response_mask"].bool()
    weights = batch.batch["rollout_is_weights"]
    assert corr_metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == len(REJECTED) / len(valid)
    carrying = eligible & kept & (weights > 0)
    assert 0 < carrying.sum() < (eligible & kept).sum() < eligible.sum()

    metrics = trainer_around(cfg, worker)._update_actor(batch).meta_info["metrics"]
    # verl's own loss took the weights and the mask: at ratio 1, token-mean of -A * w over the kept tokens
    pg_loss = -(batch.batch["advantages"] * weights * kept).sum() / kept.sum()
    assert metrics["actor/pg_loss"] == [pytest.approx(float(pg_loss), abs=1e-6)]
    assert metrics["actor/effective_token_frac"] == pytest.approx(float(carrying.sum() / eligible.sum()))
    assert "actor/effective_tokens" not in metrics and "commrl_eligible_mask" not in batch.batch
    assert metrics["mismatch/logprob_corr"] < 1.0  # decoupled: the trainer's own old pass vs the sampler


def test_bypass_mode_runs_verls_bypass_loss_in_the_workers(cpu_verl, tiny_model_dir, method):
    """Bypass mode (rl.behaviour_logprobs=sampler): verl's fit swaps old := the sampler's log-probs; the
    workers built from the resolved config run verl's bypass_mode loss (its rejection and its
    rollout_corr/* read-outs), and the clip against the sampler shows in actor/effective_token_frac."""
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

    cfg = worker_config(cpu_verl, tiny_model_dir, list(SYNC_CORRECTED))
    method(**DENSE)
    worker = cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "commrl")

    def log_ratio(row, n):  # trainer / sampler: 3 on rejected rows; one token at 1.5 (> 1 + eps) elsewhere
        r = torch.zeros(n)
        r[:] = torch.log(torch.tensor(3.0)) if row in REJECTED else 0.0
        if row not in REJECTED:
            r[row % n] = torch.log(torch.tensor(1.5))
        return r

    batch, _ = sampled_batch(cpu_verl, worker, log_ratio)
    apply_bypass_mode(
        batch, cfg.algorithm.rollout_correction, copy.deepcopy(cfg.actor_rollout_ref.actor.policy_loss)
    )
    advantages(batch, cfg)
    adv, mask = batch.batch["advantages"], batch.batch["response_mask"].bool()
    eligible = mask & (adv != 0)
    rejected = torch.zeros_like(mask)
    rejected[sorted(REJECTED)] = True
    shifted = torch.zeros_like(mask)
    for i in set(range(len(mask))) - REJECTED:
        shifted[i, i % int(mask[i].sum())] = True
    clipped = shifted & (adv > 0)  # ratio 1.5 > 1.2 with A > 0: PPO's clip takes the gradient away
    carrying = eligible & ~rejected & ~clipped
    assert clipped.sum() > 0 and carrying.sum() < (eligible & ~rejected).sum()

    metrics = trainer_around(cfg, worker)._update_actor(batch).meta_info["metrics"]
    masked = metrics["actor/rollout_corr/rollout_rs_seq_masked_fraction"]  # verl's bypass loss ran
    assert sum(masked) / len(masked) == pytest.approx(len(REJECTED) / len(mask))
    assert metrics["actor/effective_token_frac"] == pytest.approx(float(carrying.sum() / eligible.sum()))
    assert not any(key.startswith("mismatch/") for key in metrics)  # no trainer old pass to compare
