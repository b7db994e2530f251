"""Asynchronous training (``rl.staleness``), bypass mode and rollout correction in the local driver.

Every weight, mask and loss is checked against verl's own functions or a hand computation on the same
tensors; the runs use the small random policy of ``conftest.py`` (mechanics, not skill).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from rl_helpers import overrides

from commrl.errors import ConfigError
from commrl.rl import correction, grpo
from commrl.rl.config import RLConfig, load_train_config
from commrl.rl.trainer import LocalTrainer
from commrl.run.hooks import TrainCallbacks


def _cfg(tmp_path, toy_data, small_model, name: str, *extra: str):
    return load_train_config(
        overrides(small_model, toy_data, tmp_path / name, "", "tracking.enabled=false", *extra)
    )


class Recording(LocalTrainer):
    """Keeps each tick's batch, the live weights at its start, and what the update was given."""

    def __init__(self, cfg, **kwargs) -> None:
        super().__init__(cfg, **kwargs)
        self.batches: dict[int, object] = {}
        self.weights_at: dict[int, dict[str, torch.Tensor]] = {}
        self.updates: list[dict] = []
        self.replays: list[dict] = []

    def _tick(self, tick: int):
        self.weights_at[tick] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return super()._tick(tick)

    def _sample(self, tick: int):
        batch, scores = super()._sample(tick)
        self.batches[tick] = batch
        return batch, scores

    def _dense_replay(self, batch, adv, ref_dense, metrics_out, through_codec=False, corr=None):
        self.replays.append({"batch": batch, "corr": corr, "through_codec": through_codec})
        return super()._dense_replay(batch, adv, ref_dense, metrics_out, through_codec, corr)

    def _fast_update(self, batch, adv, old, ref, fill_first=False, corr=None):
        self.updates.append({"batch": batch, "old": old.clone(), "corr": corr, "adv": adv})
        return super()._fast_update(batch, adv, old, ref, fill_first, corr)


def _policy_log_probs(trainer: Recording, weights: dict[str, torch.Tensor], batch) -> torch.Tensor:
    live = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.model.load_state_dict(weights)
    try:
        return trainer._log_probs(trainer.model, batch, "plain")
    finally:
        trainer.model.load_state_dict(live)


def _max_gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b).abs()[mask.bool()].max())


def test_staleness_one_samples_with_the_weights_of_the_previous_tick(tmp_path, toy_data, small_model):
    cfg = _cfg(
        tmp_path,
        toy_data,
        small_model,
        "k1",
        "condition=dense",
        "rl.staleness=1",
        "rl.lr=0.02",
        "rl.weight_decay=0.5",
    )
    trainer = Recording(cfg)
    trainer.train()
    for tick in (1, 2, 3):
        batch = trainer.batches[tick]
        mask = batch.response_mask
        stale = _policy_log_probs(trainer, trainer.weights_at[tick - 1], batch)
        live = _policy_log_probs(trainer, trainer.weights_at[tick], batch)
        assert _max_gap(batch.sampler_log_probs, stale, mask) < 1e-4, (
            tick
        )  # sampled with tick t - 1's weights
        assert _max_gap(batch.sampler_log_probs, live, mask) > 1e-3, tick  # not with the live ones
    tick0 = trainer.batches[0]
    assert (
        _max_gap(
            tick0.sampler_log_probs,
            _policy_log_probs(trainer, trainer.weights_at[0], tick0),
            tick0.response_mask,
        )
        < 1e-4
    )


def test_staleness_zero_samples_with_the_live_weights(tmp_path, toy_data, small_model):
    cfg = _cfg(
        tmp_path,
        toy_data,
        small_model,
        "k0",
        "condition=dense",
        "rl.lr=0.02",
        "rl.weight_decay=0.5",
        "rl.ticks=2",
        "rl.read_at=2",
    )
    trainer = Recording(cfg)
    trainer.train()
    batch = trainer.batches[1]
    live = _policy_log_probs(trainer, trainer.weights_at[1], batch)
    assert _max_gap(batch.sampler_log_probs, live, batch.response_mask) < 1e-4


def test_bypass_mode_trains_against_the_sampler_log_probs(tmp_path, toy_data, small_model):
    cfg = _cfg(
        tmp_path,
        toy_data,
        small_model,
        "bypass",
        "condition=dense",
        "rl.staleness=1",
        "rl.behaviour_logprobs=sampler",
        "rl.ticks=2",
        "rl.read_at=2",
    )
    trainer = Recording(cfg)
    trainer.train()
    for update in trainer.updates:
        assert torch.equal(update["old"], update["batch"].sampler_log_probs)
        assert update["corr"] is None
    assert trainer.actor_cfg.policy_loss.loss_mode == "bypass_mode"


def test_bypass_mode_with_a_correction_logs_its_read_outs(tmp_path, toy_data, small_model):
    """verl's bypass loss applies the correction inside the loss and its read-outs are dropped there; the
    driver logs them once per tick, from the trainer's pass at the tick's start (pi_theta before the
    step) against the sampler, with the run's correction (method.md §4b: "with a correction")."""
    ticks: list[dict[str, float]] = []

    class Metrics(TrainCallbacks):
        def on_tick(self, step, metrics) -> None:
            ticks.append(metrics)

    cfg = _cfg(
        tmp_path,
        toy_data,
        small_model,
        "bypass_tis",
        "condition=dense",
        "rl.staleness=1",
        "rl.behaviour_logprobs=sampler",
        "rl.rollout_correction.rollout_is=token",
        "rl.rollout_correction.rollout_is_threshold=2.0",
        "rl.ticks=2",
        "rl.read_at=2",
    )
    trainer = Recording(cfg, callbacks=Metrics())
    trainer.train()
    assert all(update["corr"] is None for update in trainer.updates)  # bypass: verl's loss corrects
    for tick, metrics in enumerate(ticks):
        batch = trainer.batches[tick]
        old = _policy_log_probs(trainer, trainer.weights_at[tick], batch)
        want = correction.correct(
            old, batch.sampler_log_probs, batch.response_mask, cfg.rl.rollout_correction
        )
        for key in (
            "rollout_corr/rollout_is_mean",
            "rollout_corr/rollout_is_eff_sample_size",
            "rollout_corr/kl",
        ):
            assert metrics[key] == pytest.approx(want.metrics[key], rel=1e-5, abs=1e-7), (tick, key)


def _hand_clipped_loss(log_prob, old, adv, mask, eps=0.2, clip_c=3.0):
    """PPO's dual-clip objective, token-mean: the loss verl's vanilla / bypass ppo_clip compute."""
    ratio = torch.exp(log_prob - old)
    loss1 = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps, 1 + eps))
    loss = torch.where(adv < 0, torch.minimum(loss1, -adv * clip_c), loss1)
    return (loss * mask).sum() / mask.sum()


def test_bypass_loss_equals_a_hand_computation_against_the_sampler_log_probs():
    torch.manual_seed(0)
    rl = RLConfig(behaviour_logprobs="sampler", group_size=2, micro_batch_size=4)
    actor = grpo.actor_config(rl, 4)
    log_prob = (torch.randn(4, 5) * 0.3 - 1.0).requires_grad_()
    sampler = log_prob.detach() + torch.randn(4, 5) * 0.5  # a compression-sized mismatch
    adv = torch.tensor([1.0, -1.0, 0.5, 0.0]).unsqueeze(-1).expand(4, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]]).float()
    grpo.set_global_batch(actor, mask)
    loss, metrics = grpo.grpo_loss(actor, log_prob, sampler, None, adv, mask, eligible_mask=mask)
    assert float(loss) == pytest.approx(float(_hand_clipped_loss(log_prob, sampler, adv, mask)), rel=1e-5)
    # the tokens that move the policy: inside the clip band (or on its helpful side), nonzero advantage
    ratio = torch.exp(log_prob.detach() - sampler)
    inside = ((ratio >= 0.8) & (ratio <= 1.2)) | ((adv > 0) & (ratio < 0.8)) | ((adv < 0) & (ratio > 1.2))
    inside &= ~((adv < 0) & (ratio > 3.0))
    eligible = mask.bool() & (adv != 0)
    assert metrics["actor/eligible_tokens"] == int(eligible.sum())
    assert metrics["actor/effective_tokens"] == int((inside & eligible).sum())
    assert 0 < metrics["actor/effective_tokens"] < metrics["actor/eligible_tokens"]


def test_an_icepop_band_that_drops_every_token_gives_zero_weights_not_a_crash():
    """Every ratio outside [0.5, 5]: verl 0.9.1's effective-sample-size read-out divides by zero (verl PR
    #7559). The decoupled correction is then zero weights, verl's own mask and read-outs, ESS 0; verl's
    bypass loss gets the same guard: ppo_clip (which applies no weights) is the loss without them, reinforce
    (which does) is 0 with no gradient."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    old, _, mask = _tensors()
    sampler = old + 3.0  # ratio e^-3 = 0.05 at every token
    icepop = correction.RolloutCorrection(rollout_is="token", rollout_is_threshold="0.5_5.0")
    with pytest.raises(ZeroDivisionError):  # verl's helper itself; when verl reports 0 here, drop the guard
        compute_rollout_correction_and_rejection_mask(
            old, sampler, mask, rollout_is="token", rollout_is_threshold="0.5_5.0"
        )
    corr = correction.correct(old, sampler, mask, icepop)
    assert torch.equal(corr.weights, torch.zeros_like(old)) and torch.equal(corr.mask, mask)
    assert corr.metrics["rollout_corr/rollout_is_eff_sample_size"] == 0.0
    assert corr.metrics["rollout_corr/kl"] == pytest.approx(
        correction.correct(old, sampler, mask, correction.RolloutCorrection()).metrics["rollout_corr/kl"]
    )
    adv = torch.tensor([1.0, -1.0] * 4).unsqueeze(-1).expand(8, 6)
    losses = {}
    for loss_type in ("ppo_clip", "reinforce"):
        for name, keys in (
            ("icepop", {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"}),
            ("none", {}),
        ):
            rc = correction.RolloutCorrection(loss_type=loss_type, **keys)
            actor = grpo.actor_config(
                RLConfig(behaviour_logprobs="sampler", rollout_correction=rc, group_size=2), 8
            )
            grpo.set_global_batch(actor, mask)
            log_prob = old.clone().requires_grad_()
            loss, _ = grpo.grpo_loss(actor, log_prob, sampler, None, adv, mask)
            loss.backward()
            losses[loss_type, name] = (float(loss), log_prob.grad)
    assert losses["ppo_clip", "icepop"][0] == losses["ppo_clip", "none"][0] != 0.0
    assert torch.equal(losses["ppo_clip", "icepop"][1], losses["ppo_clip", "none"][1])
    assert losses["reinforce", "icepop"][0] == 0.0 and not losses["reinforce", "icepop"][1].any()
    assert losses["reinforce", "none"][1].any()


def _tensors(seed: int = 0):
    torch.manual_seed(seed)
    old = torch.randn(8, 6) * 0.4 - 1.0
    sampler = old + torch.randn(8, 6) * 0.6 + torch.linspace(-1.2, 1.2, 8).unsqueeze(-1)  # some rows far off
    mask = (torch.rand(8, 6) > 0.2).float()
    mask[:, 0] = 1.0
    return old, sampler, mask


@pytest.mark.parametrize(
    "keys",
    [
        {"rollout_is": "token", "rollout_is_threshold": 2.0},
        {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
        {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.5_2.0"},
    ],
    ids=["tis", "icepop", "seq_rs"],
)
def test_each_correction_is_verls_helper_and_means_what_it_says(keys):
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    old, sampler, mask = _tensors()
    cfg = correction.RolloutCorrection(**keys)
    cfg.validate()
    ours = correction.correct(old, sampler, mask, cfg)
    theirs_w, theirs_mask, theirs_metrics = compute_rollout_correction_and_rejection_mask(
        old, sampler, mask, **{k: getattr(cfg, k) for k in keys}
    )
    assert torch.equal(ours.mask, theirs_mask)
    ratio = torch.exp(old - sampler)
    if "rollout_is" in keys:
        assert torch.equal(ours.weights, theirs_w.batch["rollout_is_weights"])
        if keys["rollout_is_threshold"] == 2.0:  # TIS: min(r, 2)
            assert torch.allclose(ours.weights, ratio.clamp(max=2.0) * mask, atol=1e-6)
        else:  # IcePop: r inside [0.5, 5], else 0
            band = (ratio >= 0.5) & (ratio <= 5.0)
            assert torch.allclose(ours.weights, torch.where(band, ratio, 0.0) * mask, atol=1e-6)
            assert bool((~band & mask.bool()).any())
        assert "rollout_corr/rollout_is_eff_sample_size" in ours.metrics
    else:  # the geometric-mean ratio of a sequence outside [0.5, 2] drops it whole
        geo = torch.exp(((old - sampler) * mask).sum(-1) / mask.sum(-1))
        kept = (geo >= 0.5) & (geo <= 2.0)
        assert torch.equal(ours.mask.bool().any(-1), kept)
        assert not kept.all() and kept.any()
        assert ours.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(
            theirs_metrics["rollout_corr/rollout_rs_masked_fraction"]
        )
    assert ours.metrics["rollout_corr/kl"] == pytest.approx(theirs_metrics["rollout_corr/kl"])


def test_a_decoupled_correction_reaches_the_update_as_verl_computes_it(tmp_path, toy_data, small_model):
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    class Metrics(TrainCallbacks):
        def __init__(self) -> None:
            self.ticks: list[dict[str, float]] = []

        def on_tick(self, step, metrics) -> None:
            self.ticks.append(metrics)

    cfg = _cfg(
        tmp_path,
        toy_data,
        small_model,
        "icepop",
        "condition=method_async_icepop",
        "method.cadence=100",
        "rl.ticks=2",
        "rl.read_at=2",
    )
    seen = Metrics()
    trainer = Recording(cfg, callbacks=seen)
    trainer.train()
    update = trainer.updates[-1]
    batch = update["batch"]
    weights, mask, _ = compute_rollout_correction_and_rejection_mask(
        update["old"],
        batch.sampler_log_probs,
        batch.response_mask,
        rollout_is="token",
        rollout_is_threshold="0.5_5.0",
    )
    assert torch.equal(update["corr"].weights, weights.batch["rollout_is_weights"])
    assert torch.equal(update["corr"].mask, mask)
    for metrics in seen.ticks:
        assert 0.0 <= metrics["actor/effective_token_frac"] <= 1.0
        for key in (
            "rollout_corr/kl",
            "rollout_corr/k3_kl",
            "rollout_corr/chi2_token",
            "rollout_corr/chi2_seq",
            "rollout_corr/rollout_is_eff_sample_size",
            "mismatch/logprob_corr",
        ):
            assert math.isfinite(metrics[key]), key


class _Crash(RuntimeError):
    pass


def test_resume_with_staleness_is_bit_identical(tmp_path, toy_data, small_model):
    """A crash after tick 3 (checkpoint at 2) and a rerun end with the uninterrupted run's weights."""

    class CrashAt(TrainCallbacks):
        def on_tick(self, step, metrics) -> None:
            if step == 3:
                raise _Crash

    extra = ("condition=method_async_tis", "rl.lr=0.01", "rl.weight_decay=0.5")
    straight = Recording(_cfg(tmp_path, toy_data, small_model, "straight", *extra))
    straight.train()
    cfg = _cfg(tmp_path, toy_data, small_model, "resumed", *extra)
    with pytest.raises(_Crash):
        LocalTrainer(cfg, callbacks=CrashAt()).train()
    assert (tmp_path / "resumed" / "checkpoints" / "tick_000002").is_dir()
    resumed = Recording(cfg)
    resumed.train()
    assert min(resumed.batches) == 2  # it resumed, sampling tick 2 with version 1 from the checkpoint
    assert torch.equal(resumed.batches[3].sampler_log_probs, straight.batches[3].sampler_log_probs)
    for key, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    rows = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("rl.rollout_correction.rollout_is=tokens", "rl.rollout_correction.rollout_is"),
        ("rl.rollout_correction.rollout_rs=seq_geo", "rl.rollout_correction.rollout_rs"),
        ("rl.staleness=-1", "rl.staleness"),
        ("rl.behaviour_logprobs=vllm", "rl.behaviour_logprobs"),
    ],
)
def test_a_bad_async_setting_is_rejected_naming_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_train_config([override])


def test_an_icepop_band_hydra_read_as_a_number_and_non_finite_bounds_are_rejected():
    """Hydra and YAML read an unquoted 0.5_5 as the number 0.55 (a TIS cap below 1, shrinking every weight);
    verl's parsers accept NaN (every weight NaN, or every sequence rejected); verl drops a repeated
    rejection option before it counts the thresholds (it refused this one at tick 0)."""
    is_token = "rl.rollout_correction.rollout_is=token"
    with pytest.raises(ConfigError, match=r"=0\.55: a TIS cap below 1 .* read 0\.5_5 as the number 0\.55"):
        load_train_config([is_token, "rl.rollout_correction.rollout_is_threshold=0.5_5"])
    with pytest.raises(ConfigError, match=r"rollout_is_threshold='nan_5.0': a bound is not finite"):
        load_train_config([is_token, "rl.rollout_correction.rollout_is_threshold='nan_5.0'"])
    with pytest.raises(ConfigError, match=r"rollout_rs_threshold=nan: a bound is not finite"):
        load_train_config(
            ["rl.rollout_correction.rollout_rs=seq_mean_k3", "rl.rollout_correction.rollout_rs_threshold=nan"]
        )
    with pytest.raises(ConfigError, match=r"rollout_rs_threshold='0\.5_2\.0,0\.4_2\.5': .*exactly 1"):
        load_train_config(
            [
                "rl.rollout_correction.rollout_rs='seq_mean_k1,seq_mean_k1'",
                "rl.rollout_correction.rollout_rs_threshold='0.5_2.0,0.4_2.5'",
            ]
        )
    load_train_config([is_token, "rl.rollout_correction.rollout_is_threshold='0.5_5.0'"])  # quoted: IcePop


@pytest.mark.parametrize("threshold", ["-1.0", "5.0_0.5", "abc"])
def test_an_out_of_range_threshold_is_rejected_naming_the_field(threshold):
    with pytest.raises(ConfigError, match=r"rl\.rollout_correction\.rollout_is_threshold"):
        load_train_config(
            [
                "rl.rollout_correction.rollout_is=token",
                f"rl.rollout_correction.rollout_is_threshold={threshold}",
            ]
        )


def test_the_anchors_replay_is_corrected_with_the_dense_policys_ratio(tmp_path, toy_data, small_model):
    """On a fire tick the replay's IS weights are verl's helper on the dense old pass, not the compressed."""
    cfg = _cfg(
        tmp_path,
        toy_data,
        small_model,
        "fire",
        "condition=method_async_tis",
        "rl.ticks=3",
        "rl.read_at=3",
        "rl.lr=0.02",
        "rl.weight_decay=0.5",
    )
    trainer = Recording(cfg)
    trainer.train()
    fires = [r for r in trainer.replays if not r["through_codec"]]
    assert fires and all(r["corr"] is not None for r in trainer.replays)
    tick = 2  # cadence 2: fires at ticks 0 and 2
    replay = fires[-1]
    batch = replay["batch"]
    assert batch is trainer.batches[tick]
    dense_old = _policy_log_probs(trainer, trainer.weights_at[tick], batch)
    expected = correction.correct(dense_old, batch.sampler_log_probs, batch.response_mask, trainer.correction)
    assert torch.allclose(replay["corr"].weights, expected.weights, atol=1e-5)
    assert not torch.allclose(dense_old, batch.sampler_log_probs, atol=1e-3)  # one tick of staleness


def test_bypass_modes_read_out_pass_is_not_counted_as_traffic(tmp_path, toy_data, small_model):
    """verl's bypass mode runs no old-log-prob pass; the local driver runs one for its read-outs only, so the
    ledger leaves it out: method_async's fast tick counts the bytes of method with the same staleness (the
    same rollouts, whose old pass is its update's own forward), not one forward pass more."""
    short = ("rl.mini_batches=1", "rl.ticks=2", "rl.read_at=2", "checkpoint.every=2")
    runs = {}
    for name, condition in (("bypass", "condition=method_async"), ("decoupled", "condition=method")):
        trainer = Recording(_cfg(tmp_path, toy_data, small_model, name, condition, "rl.staleness=1", *short))
        trainer.train()
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        runs[name] = (trainer, {row["step"]: row for row in rows})
    (bypass, by_b), (decoupled, by_d) = runs["bypass"], runs["decoupled"]
    assert bypass.bypass and not decoupled.bypass
    assert torch.equal(bypass.batches[1].responses, decoupled.batches[1].responses)  # the same rollouts
    fast = by_b[2]  # tick 1: no fire at cadence 2
    assert fast["anchor/fire"] == 0.0
    for key in ("comm/bytes_activations", "comm/bytes_total", "comm/bytes_dense"):
        assert fast[key] == by_d[2][key], key
