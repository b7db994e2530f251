"""GRPO through verl's own functions (``verl.trainer.ppo.core_algos``), as the cluster trainer computes it.

- advantage: ``compute_grpo_outcome_advantage`` ((score - mean_group) / (std_group + eps), method.md §1.3);
- loss: the clipped policy loss from verl's registry (``get_policy_loss_fn("vanilla")``) plus
  ``kl_coef * agg_loss(kl_penalty(log_pi, log_pi_ref, kl_type))`` (method.md §1.4), aggregated with verl's
  ``agg_loss`` over the whole mini-batch (``global_batch_info``), so micro-batch gradients sum to it.
"""

from __future__ import annotations

import numpy as np
import torch

from commrl.rl.config import RLConfig


def actor_config(rl: RLConfig, mini_batch_sequences: int):
    """verl's ``ActorConfig`` carrying the clip ratios and aggregation mode its loss functions read.

    ``rl.behaviour_logprobs: sampler`` selects verl's bypass-mode loss (``loss_mode: bypass_mode``, with the
    run's ``rollout_correction``), exactly as verl's ``apply_bypass_mode`` sets it up.
    """
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    policy_loss = PolicyLossConfig()
    if rl.behaviour_logprobs == "sampler":
        policy_loss = PolicyLossConfig(
            loss_mode="bypass_mode", rollout_correction=rl.rollout_correction.to_verl(bypass_mode=True)
        )
    return ActorConfig(
        policy_loss=policy_loss,
        strategy="fsdp",
        rollout_n=rl.group_size,
        ppo_mini_batch_size=max(1, mini_batch_sequences // rl.group_size),
        ppo_micro_batch_size_per_gpu=rl.micro_batch_size,
        clip_ratio=rl.clip_ratio,
        clip_ratio_low=rl.clip_ratio,
        clip_ratio_high=rl.clip_ratio,
        loss_agg_mode=rl.loss_agg_mode,
        use_kl_loss=rl.kl_coef > 0,
        kl_loss_coef=rl.kl_coef,
        kl_loss_type=rl.kl_type,
        entropy_coeff=0.0,
        use_torch_compile=False,
    )


def grpo_advantages(
    scores: torch.Tensor, response_mask: torch.Tensor, uids: np.ndarray, norm_by_std: bool = True
) -> torch.Tensor:
    """Outcome advantages ``[B, R]`` from one verifiable score per sequence (verl's GRPO estimator)."""
    from verl.trainer.ppo import core_algos

    token_rewards = torch.zeros_like(response_mask)
    last = (response_mask.sum(-1).long() - 1).clamp(min=0)
    token_rewards[torch.arange(len(scores)), last] = scores.float()
    advantages, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_rewards,
        response_mask=response_mask,
        index=uids,
        norm_adv_by_std_in_grpo=norm_by_std,
    )
    return advantages


# a micro-batch's share of its mini-batch's loss (the loss is normalised by the whole mini-batch): verl tags
# these AggregationType.SUM, so a mini-batch's value is the sum over its micro-batches
SUMMED_METRICS: tuple[str, ...] = ("actor/pg_loss",)


def add_mini_batch(acc: dict[str, list[float]], micro: dict[str, list[float]]) -> None:
    """Append one mini-batch's micro-batch metrics to ``acc``: each of ``SUMMED_METRICS`` as its sum over the
    micro-batches (verl's ``AggregationType.SUM``), the others value by value (``MEAN``, later)."""
    for key, values in micro.items():
        acc.setdefault(key, []).extend([float(sum(values))] if key in SUMMED_METRICS else values)


def global_batch(response_mask: torch.Tensor) -> dict[str, int | None]:
    """verl's ``global_batch_info`` of one batch (``response_mask``; at least one token, so a mini-batch that
    rejection sampling emptied gives a zero loss, not NaN)."""
    return dict(
        dp_size=1,
        batch_num_tokens=max(1, int(response_mask.sum().item())),
        global_batch_size=int(response_mask.shape[0]),
        loss_scale_factor=None,
    )


def set_global_batch(actor_cfg, response_mask: torch.Tensor) -> None:
    """Aggregate every micro-batch's loss over the whole mini-batch (``response_mask`` of the mini-batch)."""
    actor_cfg.global_batch_info.update(global_batch(response_mask))


def _bypass_without_weights(actor_cfg, old_log_prob, log_prob, advantages, response_mask):
    """verl's bypass-mode loss for a micro-batch whose every IS weight is 0 (IcePop, every token outside its
    band), where verl 0.9.1's loss raises ``ZeroDivisionError`` in its effective-sample-size read-out (verl PR
    #7559): the rejection mask from verl's helper, then the loss verl's bypass dispatch calls (ppo_clip: the
    vanilla loss, which takes no weights; reinforce: its IS-weighted loss, with the weights, all 0)."""
    from verl.trainer.ppo import core_algos

    from commrl.rl.correction import RolloutCorrection, correct

    verl_cfg = actor_cfg.policy_loss.rollout_correction
    cfg = RolloutCorrection(**{k: getattr(verl_cfg, k) for k in RolloutCorrection.__dataclass_fields__})
    corr = correct(log_prob.detach(), old_log_prob, response_mask, cfg)
    common = dict(log_prob=log_prob, advantages=advantages, response_mask=corr.mask, config=actor_cfg)
    if cfg.loss_type == "reinforce":
        return core_algos.compute_policy_loss_reinforce(
            rollout_log_prob=old_log_prob,
            loss_agg_mode=actor_cfg.loss_agg_mode,
            rollout_is_weights=corr.weights,
            **common,
        )
    return core_algos.compute_policy_loss_vanilla(
        old_log_prob=old_log_prob, loss_agg_mode=actor_cfg.loss_agg_mode, rollout_is_weights=None, **common
    )


def grpo_loss(
    actor_cfg,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor | None,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    eligible_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``pg_loss + kl_coef * kl_loss`` for one micro-batch, and verl's metric names.

    ``rollout_is_weights`` (decoupled rollout correction) multiply the per-token policy loss, as verl's
    actor passes them. ``eligible_mask`` (the mask before rejection sampling) adds the counts of
    ``effective_token_counts`` as ``actor/effective_tokens`` and ``actor/eligible_tokens``. The bypass-mode
    loss's own ``rollout_corr/*`` read-outs are dropped: the driver logs them once per tick.
    """
    from verl.trainer.ppo import core_algos

    mask = response_mask.bool()
    loss_mode = actor_cfg.policy_loss.get("loss_mode", "vanilla")
    args = dict(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=mask)
    try:
        pg_loss, pg_metrics = core_algos.get_policy_loss_fn(loss_mode)(
            **args,
            loss_agg_mode=actor_cfg.loss_agg_mode,
            config=actor_cfg,
            rollout_is_weights=rollout_is_weights,
        )
    except ZeroDivisionError:
        if loss_mode != "bypass_mode":
            raise
        pg_loss, pg_metrics = _bypass_without_weights(actor_cfg, **args)
    metrics = {k: float(v) for k, v in pg_metrics.items() if not k.startswith("rollout_corr/")}
    metrics["actor/pg_loss"] = float(pg_loss.detach())
    if eligible_mask is not None and log_prob.requires_grad:
        carrying, eligible = effective_token_counts(pg_loss, log_prob, advantages, eligible_mask)
        metrics["actor/effective_tokens"] = float(carrying)
        metrics["actor/eligible_tokens"] = float(eligible)
    loss = pg_loss
    if actor_cfg.use_kl_loss and ref_log_prob is not None:
        kl = kl_value(actor_cfg, log_prob, ref_log_prob, mask)
        loss = loss + actor_cfg.kl_loss_coef * kl
        metrics["actor/kl_loss_minibatch"] = float(kl.detach())
    return loss, metrics


def effective_token_counts(
    pg_loss: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> tuple[int, int]:
    """(tokens whose policy-gradient loss moves the policy, eligible tokens) of one micro-batch.

    Eligible: a valid response token (``mask``, before rejection) with a nonzero advantage. It carries
    gradient when ``d pg_loss / d log_pi_t != 0``: not clipped, not rejected, not zero-weighted by a
    correction. Exact, from autograd on the loss verl computed (no model pass; the graph is kept).
    ``actor/effective_token_frac`` = carrying / eligible over a tick.
    """
    (grad,) = torch.autograd.grad(pg_loss, log_prob, retain_graph=True)
    eligible = mask.bool() & (advantages != 0)
    return int((eligible & (grad != 0)).sum()), int(eligible.sum())


def batch_kl(kl_type: str, loss_agg_mode: str, log_prob, ref_log_prob, mask) -> torch.Tensor:
    """``agg_loss(kl_penalty(log_pi, log_pi_ref))`` over one whole batch (its own ``global_batch``): a
    tick's read-outs (``actor/kl_loss``, the trainer's old pass against the reference pass, as both drivers
    log it; ``policy/kl_true_weights``)."""
    return _kl(kl_type, loss_agg_mode, log_prob, ref_log_prob, mask, global_batch(mask))


def kl_value(actor_cfg, log_prob, ref_log_prob, mask) -> torch.Tensor:
    """``agg_loss(kl_penalty(log_pi, log_pi_ref))`` with the configured estimator (low_var_kl = k3), over
    the mini-batch ``set_global_batch`` named (a micro-batch's term of the loss)."""
    return _kl(
        actor_cfg.kl_loss_type,
        actor_cfg.loss_agg_mode,
        log_prob,
        ref_log_prob,
        mask,
        actor_cfg.global_batch_info,
    )


def _kl(kl_type: str, loss_agg_mode: str, log_prob, ref_log_prob, mask, global_info) -> torch.Tensor:
    from verl.trainer.ppo import core_algos

    kld = core_algos.kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=kl_type)
    return core_algos.agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=loss_agg_mode, **global_info)
