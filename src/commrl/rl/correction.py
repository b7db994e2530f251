"""Rollout correction: verl's own importance weights and rejection masks for off-policy rollouts.

The trainer's policy differs from the sampler's for two reasons: compression (the trainer runs the codec,
the sampler the true weights) and, with ``rl.staleness: k``, policy lag (the sampler's weights are k ticks
old). Both land in the ratio ``r_t = pi_train(y_t) / pi_sampler(y_t)``. verl 0.9.1 corrects it with
``algorithm.rollout_correction`` (``verl.trainer.config.algorithm.RolloutCorrectionConfig``); this module
keeps those key names, so one YAML block works for both drivers, and calls verl's helper
(``verl.trainer.ppo.rollout_corr_helper``) for every weight, mask and read-out:

- token TIS: ``w_t = min(r_t, C)`` (``rollout_is: token``, ``rollout_is_threshold: C``);
- IcePop: ``w_t = r_t`` inside ``[lo, hi]``, else 0 (``rollout_is_threshold: "lo_hi"``);
- rejection (e.g. ``rollout_rs: seq_mean_k1``: verl bounds ``k1 = mean_t (-log r_t)`` by
  ``[log lo, log hi]``, so a sequence whose geometric-mean ratio ``exp(mean_t log r_t)`` leaves
  ``[1/hi, 1/lo]`` is masked whole; the same band as ``[lo, hi]`` when it is symmetric, ``lo = 1/hi``).

``bypass_mode`` is not a key here: it is ``rl.behaviour_logprobs: sampler`` (the clipped objective's ``old``
is the sampler's log-probs), and the verl driver sets verl's ``bypass_mode`` from it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from commrl.errors import ConfigError

if TYPE_CHECKING:  # torch and verl load when a correction runs: the report reads LOGGED_METRICS without them
    import torch

BEHAVIOUR_LOGPROBS = ("trainer", "sampler")
ROLLOUT_IS = ("token", "sequence")
LOSS_TYPES = ("ppo_clip", "reinforce")

# verl's read-outs logged every tick (verl logs more; these are the ones the report and the health
# monitor read). Names are verl's, with its ``rollout_corr/`` prefix.
LOGGED_METRICS = (
    "rollout_corr/kl",
    "rollout_corr/k3_kl",
    "rollout_corr/chi2_token",
    "rollout_corr/chi2_seq",
    "rollout_corr/log_ppl_abs_diff",
    "rollout_corr/rollout_is_eff_sample_size",
    "rollout_corr/rollout_is_mean",
    "rollout_corr/rollout_is_ratio_fraction_high",
    "rollout_corr/rollout_is_ratio_fraction_low",
    "rollout_corr/rollout_rs_masked_fraction",
    "rollout_corr/rollout_rs_seq_masked_fraction",
)


@dataclass
class RolloutCorrection:
    """``algorithm.rollout_correction`` of verl 0.9.1, less ``bypass_mode``; every default is "off".

    (verl's own dataclass defaults ``rollout_is`` to ``sequence``; here an unset key corrects nothing.)
    """

    rollout_is: Any = None  # None | token | sequence
    rollout_is_threshold: Any = 2.0  # float (TIS) or "lower_upper" (IcePop)
    rollout_is_batch_normalize: bool = False
    rollout_rs: Any = None  # None | comma list of verl's SUPPORTED_ROLLOUT_RS_OPTIONS
    rollout_rs_threshold: Any = None
    loss_type: str = "ppo_clip"  # bypass mode only: ppo_clip | reinforce

    @property
    def enabled(self) -> bool:
        return self.rollout_is is not None or self.rollout_rs is not None

    def validate(self, prefix: str = "rl.rollout_correction") -> None:
        """Check every key with verl's own parsers; errors name the field and what it accepts."""
        from verl.trainer.ppo import rollout_corr_helper as helper

        if self.rollout_is is not None and self.rollout_is not in ROLLOUT_IS:
            raise ConfigError(
                f"{prefix}.rollout_is={self.rollout_is!r} is not one of null, {', '.join(ROLLOUT_IS)}"
            )
        if self.loss_type not in LOSS_TYPES:
            raise ConfigError(f"{prefix}.loss_type={self.loss_type!r} is not one of {', '.join(LOSS_TYPES)}")
        if self.rollout_is is not None:
            field = f"{prefix}.rollout_is_threshold={self.rollout_is_threshold!r}"
            try:
                upper, lower = helper._parse_rollout_is_threshold(self.rollout_is_threshold)
            except (TypeError, ValueError) as err:
                raise ConfigError(
                    f"{field}: {err} (a positive float for TIS, or 'lower_upper' with 0 < lower <= upper "
                    "for IcePop)"
                ) from None
            if not all(math.isfinite(v) for v in (upper, lower) if v is not None):
                raise ConfigError(f"{field}: a bound is not finite; give finite positive bounds")
            if lower is None and upper < 1:
                raise ConfigError(
                    f"{field}: a TIS cap below 1 shrinks every weight, the ratio-one tokens' too; for "
                    "IcePop's band quote 'lower_upper' with a decimal point in each (\"0.5_5.0\"): Hydra and "
                    "YAML read 0.5_5 as the number 0.55"
                )
        if self.rollout_rs is not None:
            # verl drops repeated options before it counts the thresholds
            options = list(dict.fromkeys(o.strip() for o in str(self.rollout_rs).split(",") if o.strip()))
            unknown = sorted(set(options) - helper.SUPPORTED_ROLLOUT_RS_OPTIONS)
            if not options or unknown:
                raise ConfigError(
                    f"{prefix}.rollout_rs={self.rollout_rs!r}: unknown option(s) "
                    f"{', '.join(unknown) or '(none)'}; verl supports "
                    + ", ".join(sorted(helper.SUPPORTED_ROLLOUT_RS_OPTIONS))
                )
            field = f"{prefix}.rollout_rs_threshold={self.rollout_rs_threshold!r}"
            try:
                bands = helper._parse_rollout_rs_thresholds(options, self.rollout_rs_threshold)
            except (TypeError, ValueError) as err:
                raise ConfigError(f"{field}: {err}") from None
            if not all(math.isfinite(v) for band in bands.values() for v in band.values() if v is not None):
                raise ConfigError(f"{field}: a bound is not finite; give finite positive bounds")

    def to_verl(self, bypass_mode: bool):
        """verl's ``RolloutCorrectionConfig`` with these keys and ``bypass_mode``."""
        from verl.trainer.config.algorithm import RolloutCorrectionConfig

        return RolloutCorrectionConfig(**asdict(self), bypass_mode=bypass_mode)

    def verl_overrides(self, bypass_mode: bool) -> dict[str, Any]:
        """``algorithm.rollout_correction.*`` for verl's Hydra config (every key explicit)."""
        return {
            f"algorithm.rollout_correction.{k}": v
            for k, v in {**asdict(self), "bypass_mode": bypass_mode}.items()
        }


@dataclass
class Correction:
    """One batch's correction: IS weights (None when off), the mask after rejection, verl's read-outs."""

    weights: torch.Tensor | None
    mask: torch.Tensor
    metrics: dict[str, float]


def check_mode(behaviour_logprobs: str, correction: RolloutCorrection) -> None:
    """The loss type applies in bypass mode only (``rl.behaviour_logprobs=sampler``): verl ignores it in
    decoupled mode, so a non-default one there is refused (both drivers)."""
    if behaviour_logprobs == "trainer" and correction.loss_type != "ppo_clip":
        raise ConfigError(
            f"rl.rollout_correction.loss_type={correction.loss_type!r} is invalid with "
            "rl.behaviour_logprobs=trainer: the loss type applies in bypass mode only (verl ignores it "
            "otherwise); set rl.behaviour_logprobs=sampler or loss_type=ppo_clip"
        )


def loss_inputs(
    corr: Correction | None, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The (loss mask, IS weights) a policy loss reads: the correction's, or the batch's mask and none."""
    return (response_mask, None) if corr is None else (corr.mask, corr.weights)


def correct(
    trainer_log_probs: torch.Tensor,
    sampler_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    cfg: RolloutCorrection,
) -> Correction:
    """verl's ``compute_rollout_correction_and_rejection_mask(old=trainer, rollout=sampler)`` (decoupled).

    With ``cfg`` off it returns no weights, the mask unchanged and verl's off-policy read-outs
    (``rollout_corr/kl``, ``k3_kl``, ``chi2_token``, ``chi2_seq``, ...), filtered to ``LOGGED_METRICS``.

    When every weight is 0 (IcePop with every token outside its band), verl 0.9.1's effective-sample-size
    read-out divides by zero (``ZeroDivisionError``; verl PR #7559 reports 0 there): the correction is then
    zero weights, verl's mask and off-policy read-outs without the IS step, and ``rollout_is_mean`` and
    ``rollout_is_eff_sample_size`` 0 (the IS step's other read-outs are not logged that tick).
    """
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    def helper(rollout_is: str | None):
        return compute_rollout_correction_and_rejection_mask(
            old_log_prob=trainer_log_probs,
            rollout_log_prob=sampler_log_probs,
            response_mask=response_mask,
            rollout_is=rollout_is,
            rollout_is_threshold=cfg.rollout_is_threshold,
            rollout_is_batch_normalize=cfg.rollout_is_batch_normalize,
            rollout_rs=cfg.rollout_rs,
            rollout_rs_threshold=cfg.rollout_rs_threshold,
        )

    try:
        weights, mask, metrics = helper(cfg.rollout_is)
    except ZeroDivisionError:
        if cfg.rollout_is is None:
            raise
        _, mask, metrics = helper(None)
        zero = {"rollout_corr/rollout_is_mean": 0.0, "rollout_corr/rollout_is_eff_sample_size": 0.0}
        return Correction(
            sampler_log_probs.new_zeros(sampler_log_probs.shape), mask, {**_logged(metrics), **zero}
        )
    w = weights.batch["rollout_is_weights"] if weights is not None else None
    return Correction(w, mask, _logged(metrics))


def _logged(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if k in LOGGED_METRICS}
