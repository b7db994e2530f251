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
from verl.utils.metric import reduce_metrics

from commrl.cli.main import main
from commrl.errors import ConfigError
from commrl.rl.config import HealthConfig, RLConfig
from commrl.rl.correction import RolloutCorrection
from commrl.verl_ext import config as vc
from commrl.verl_ext.config import method_from_env
from commrl.verl_ext.engine import (
    ANCHOR_ADV_KEY,
    ANCHOR_IS_KEY,
    ANCHOR_MASK_KEY,
    DENSE_REF_KEY,
    ELIGIBLE_KEY,
)
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
    trainer.checks = StepChecks(method_from_env(), HealthConfig())
    return trainer


def sampled_batch(cpu_verl, worker, log_ratio, below=None):
    """The harness batch with the trainer's log-probs and the sampler's at ``log_ratio`` below them (or below
    the log-probs of the worker ``below``; ``log_ratio(row, length) -> (length,)``), and token-level rewards
    as verl's reward step leaves them."""
    batch = cpu_verl.training_batch(worker)
    trainer_lp = cpu_verl.log_probs(worker, batch)
    mask = batch.batch["response_mask"]
    rollout = (trainer_lp if below is None else cpu_verl.log_probs(below, batch)).clone()
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        rollout[i, :n] -= log_ratio(i, n)
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(mask.shape[0]), mask.sum(-1) - 1] = batch.batch["scores"]
    batch.batch["token_level_rewards"] = rewards
    batch.batch["rollout_log_probs"] = rollout
    batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()  # as verl's fit
    del batch.batch["advantages"]  # verl computes them after the correction
    return batch, trainer_lp


def advantages(batch, cfg) -> None:
    from verl.trainer.ppo.ray_trainer import compute_advantage

    compute_advantage(batch, adv_estimator="grpo", num_repeat=cfg.actor_rollout_ref.rollout.n)


REJECTED = {1, 6, 11, 12}  # rows whose sampler ratio is 3 on every token (geometric mean 3 > 2)
# decoupled IcePop (weights zero outside [0.5, 5]) and sequence rejection (geometric mean outside [0.5, 2])
DECOUPLED_CORRECTED = (
    "rl.rollout_correction.rollout_is=token",
    "rl.rollout_correction.rollout_is_threshold=0.5_5.0",
    "rl.rollout_correction.rollout_rs=seq_mean_k1",
    "rl.rollout_correction.rollout_rs_threshold=0.5_2.0",
)


def rejecting(outlier: float):
    """``log_ratio`` of ``sampled_batch``: ratio 3 on every token of the REJECTED rows; on the others 1, but
    ``outlier`` on token ``row % length`` (the sequence's geometric mean stays inside [0.5, 2])."""

    def log_ratio(row: int, n: int) -> torch.Tensor:
        r = torch.zeros(n)
        r[:] = torch.log(torch.tensor(3.0)) if row in REJECTED else 0.0
        if row not in REJECTED:
            r[row % n] = torch.log(torch.tensor(outlier))
        return r

    return log_ratio


def outlier_tokens(mask: torch.Tensor) -> torch.Tensor:
    """(batch, response) bool: the ``outlier`` token of each row outside REJECTED (``rejecting``)."""
    out = torch.zeros_like(mask, dtype=torch.bool)
    for i in set(range(len(mask))) - REJECTED:
        out[i, i % int(mask[i].sum())] = True
    return out


def test_decoupled_icepop_and_rejection_reach_verls_loss(cpu_verl, tiny_model_dir, method):
    """Decoupled mode, as verl's fit runs it: its helper masks the rejected sequences and zeroes IcePop's
    out-of-band weights before the advantages; the engine's update counts exactly the other eligible tokens
    as carrying gradient (ratio 1: nothing clipped), and the rejected ones as eligible."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    cfg = worker_config(cpu_verl, tiny_model_dir, list(DECOUPLED_CORRECTED))
    method(**DENSE)
    worker = cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "commrl")
    batch, trainer_lp = sampled_batch(cpu_verl, worker, rejecting(6.0))  # 6: outside IcePop's band
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
    batch, _ = sampled_batch(cpu_verl, worker, rejecting(1.5))  # trainer / sampler 1.5 > 1 + eps
    apply_bypass_mode(
        batch, cfg.algorithm.rollout_correction, copy.deepcopy(cfg.actor_rollout_ref.actor.policy_loss)
    )
    advantages(batch, cfg)
    adv, mask = batch.batch["advantages"], batch.batch["response_mask"].bool()
    eligible = mask & (adv != 0)
    rejected = torch.zeros_like(mask)
    rejected[sorted(REJECTED)] = True
    # ratio 1.5 > 1.2 with A > 0: PPO's clip takes the gradient away
    clipped = outlier_tokens(mask) & (adv > 0)
    carrying = eligible & ~rejected & ~clipped
    assert clipped.sum() > 0 and carrying.sum() < (eligible & ~rejected).sum()

    metrics = trainer_around(cfg, worker)._update_actor(batch).meta_info["metrics"]
    masked = metrics["actor/rollout_corr/rollout_rs_seq_masked_fraction"]  # verl's bypass loss ran
    assert sum(masked) / len(masked) == pytest.approx(len(REJECTED) / len(mask))
    assert metrics["actor/effective_token_frac"] == pytest.approx(float(carrying.sum() / eligible.sum()))
    assert not any(key.startswith("mismatch/") for key in metrics)  # no trainer old pass to compare


def test_decoupled_fire_corrects_the_replay_from_a_dense_old_pass(cpu_verl, tiny_model_dir, method):
    """Decoupled mode on a fire tick (method.md §4b): the trainer adds a dense old pass and the anchor's
    replay takes its correction, ``rho = pi_old_dense / pi_sampler``, not verl's from the compressed old
    pass: the dense rejection's mask and token count, its IcePop weights and the advantages before any
    rejection; verl's names under ``anchor/``, as the local driver logs them. A fast tick adds none."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    cfg = worker_config(cpu_verl, tiny_model_dir, list(DECOUPLED_CORRECTED))
    stock = cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "stock")
    method(codec="lowrank", cadence=2)
    worker = cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "commrl")

    # the sampler below the dense log-probs: the dense ratio rejects REJECTED and is 6 on the outlier tokens
    batch, compressed = sampled_batch(cpu_verl, worker, rejecting(6.0), below=stock)
    tensors = batch.batch
    valid = tensors["response_mask"].bool().clone()
    dense, rollout = cpu_verl.log_probs(stock, batch), tensors["rollout_log_probs"]
    # one more row whose sampler ratio has the geometric mean 2 exp(-g/2) for the dense pass and 2 exp(g/2)
    # for the compressed one (g = the row's mean log(pi_compressed / pi_dense) > 0): only verl rejects it
    gap = ((compressed - dense) * valid).sum(-1) / valid.sum(-1)
    edge = max(set(range(len(valid))) - REJECTED, key=lambda row: float(gap[row]))
    assert gap[edge] > 0
    rollout[edge, valid[edge]] = dense[edge, valid[edge]] - (torch.log(torch.tensor(2.0)) - gap[edge] / 2)
    tensors["old_log_probs"] = compressed
    pre = copy.deepcopy(batch)
    advantages(pre, cfg)
    adv = pre.batch["advantages"]  # before any rejection
    batch, _ = compute_rollout_correction_and_add_to_batch(batch, cfg.algorithm.rollout_correction)
    advantages(batch, cfg)
    kept = valid.clone()
    kept[sorted(REJECTED)] = False
    assert kept[edge].any() and not batch.batch["response_mask"][edge].any()  # verl's rejection differs
    assert (adv[edge] != 0).any()  # the replay needs the advantages verl's rejection zeroed
    rho = torch.exp(dense - rollout)
    weights = rho * ((rho >= 0.5) & (rho <= 5.0))  # IcePop on the dense ratio

    trainer = trainer_around(cfg, worker)  # global step 1: tick 0 fires
    metrics = trainer._update_actor(batch).meta_info["metrics"]
    assert metrics["anchor/rollout_corr/rollout_rs_seq_masked_fraction"] == len(REJECTED) / len(valid)
    pg_loss = -(adv * weights * kept).sum() / kept.sum()  # ratio one
    assert metrics["actor/pg_loss"] == [pytest.approx(float(pg_loss), abs=1e-6)]
    eligible = valid & (adv != 0)
    carrying = eligible & kept & (weights > 0)
    assert 0 < carrying.sum() < eligible.sum()
    assert metrics["actor/effective_token_frac"] == pytest.approx(float(carrying.sum() / eligible.sum()))
    assert not set(batch.batch.keys()) & {ANCHOR_MASK_KEY, ANCHOR_IS_KEY, ANCHOR_ADV_KEY, ELIGIBLE_KEY}

    trainer.global_steps = 2  # tick 1: fast, verl's correction from the compressed old pass
    batch, compressed = sampled_batch(cpu_verl, worker, rejecting(6.0))
    batch.batch["old_log_probs"] = compressed
    batch, _ = compute_rollout_correction_and_add_to_batch(batch, cfg.algorithm.rollout_correction)
    advantages(batch, cfg)
    metrics = trainer._update_actor(batch).meta_info["metrics"]
    assert not any(key.startswith("anchor/rollout_corr/") for key in metrics)


def test_bypass_anchor_off_calibrates_before_tick_0s_reference_pass(cpu_verl, tiny_model_dir, method):
    """Bypass mode runs no old pass, so with the anchor off tick 0's first pass through the codec would be
    the reference's, on the random basis. The trainer's reference step first runs an actor read-out
    (uncounted), which calibrates once: the reference log-probs are those after an old pass's calibration."""
    cfg = worker_config(cpu_verl, tiny_model_dir, list(SYNC_CORRECTED))
    method(codec="lowrank", grad_codec="powersgd", anchor=False, projection="none")
    # the expected pair first: the reference uses the actor engine built last in this process
    old_pass_actor = cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "commrl")
    old_pass_ref = cpu_verl.build_worker(cfg.actor_rollout_ref, "ref", "commrl")
    batch = cpu_verl.training_batch(old_pass_actor)
    batch.batch.pop("ref_log_prob")
    batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()  # as verl's fit
    uncalibrated = cpu_verl.log_probs(old_pass_ref, batch, ref=True)
    cpu_verl.log_probs(old_pass_actor, batch)  # the old pass: calibrates
    want = cpu_verl.log_probs(old_pass_ref, batch, ref=True)
    assert not torch.equal(want, uncalibrated)

    worker = cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "commrl")
    trainer = trainer_around(cfg, worker)
    trainer.ref_policy_wg = cpu_verl.build_worker(cfg.actor_rollout_ref, "ref", "commrl")
    trainer.ref_in_actor = False
    ref = trainer._compute_ref_log_prob(batch)
    assert torch.equal(ref.batch["ref_log_prob"], want)
    calibrated = old_pass_actor.actor.engine.controller.ledger.tick_bytes["basis_refresh"]
    assert worker.actor.engine.controller.ledger.tick_bytes["basis_refresh"] == calibrated > 0  # once


def test_bypass_fire_reads_out_through_the_codec_uncounted(cpu_verl, tiny_model_dir, method):
    """Bypass mode on a fire tick: verl's bypass loss reads the ratio-one replay (``rho = 1``: its
    ``actor/rollout_corr/*`` say no mismatch). The trainer adds the local driver's read-out pass, through the
    codec and uncounted, for ``rollout_corr/*`` and ``actor/kl_loss``; the update and its bytes are those of
    the trainer without it, and no dense pass runs."""
    from verl.trainer.ppo.ray_trainer import compute_response_mask
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

    from commrl.rl.correction import correct
    from commrl.rl.grpo import batch_kl

    cfg = worker_config(cpu_verl, tiny_model_dir, list(SYNC_CORRECTED))
    method(codec="lowrank", cadence=2)
    # three fresh workers: one samples (its pass is counted), one trains with the read-out, one without
    sampler, worker, plain_worker = (
        cpu_verl.build_worker(cfg.actor_rollout_ref, "actor", "commrl") for _ in range(3)
    )
    batch, compressed = sampled_batch(cpu_verl, sampler, rejecting(1.5))
    for key in ("ref_log_prob", DENSE_REF_KEY):  # a reference near the policy (verl's k3 clamps at 10)
        batch.batch[key] = compressed + 0.1
    apply_bypass_mode(
        batch, cfg.algorithm.rollout_correction, copy.deepcopy(cfg.actor_rollout_ref.actor.policy_loss)
    )
    advantages(batch, cfg)
    plain_trainer = trainer_around(cfg, plain_worker)
    plain_trainer.checks.method = None  # verl's update alone
    plain = plain_trainer._update_actor(copy.deepcopy(batch)).meta_info["metrics"]
    metrics = trainer_around(cfg, worker)._update_actor(batch).meta_info["metrics"]

    valid = compute_response_mask(batch)
    rl = vc.compose_run("A", "dense", 0, list(SYNC_CORRECTED)).rollout_correction
    want = correct(compressed, batch.batch["rollout_log_probs"], valid, rl).metrics
    assert want["rollout_corr/rollout_rs_seq_masked_fraction"] == len(REJECTED) / len(valid)
    assert {key: metrics[key] for key in want} == pytest.approx(want)
    assert plain["actor/rollout_corr/rollout_rs_seq_masked_fraction"] == [0.0]  # the replay: rho = 1
    assert "rollout_corr/kl" not in method_metrics(reduce_metrics(dict(metrics)))  # the read-out's is logged
    actor = cfg.actor_rollout_ref.actor
    kl = batch_kl(
        actor.kl_loss_type, actor.loss_agg_mode, compressed, batch.batch["ref_log_prob"], valid.bool()
    )
    assert metrics["actor/kl_loss"] == pytest.approx(float(kl))
    assert plain["actor/kl_loss"] != [pytest.approx(float(kl))]  # the replay's, at the dense view
    for key in ("actor/pg_loss", "actor/comm/bytes_activations", "actor/comm/bytes_dense"):
        assert metrics[key] == plain[key], key
    ours, theirs = (cpu_verl.full_params(cpu_verl.engine_of(w)) for w in (worker, plain_worker))
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    assert not any(key.startswith("anchor/rollout_corr/") for key in metrics)
