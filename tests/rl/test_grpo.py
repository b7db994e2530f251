"""GRPO pieces of the local driver against verl's own functions and hand computations."""

import numpy as np
import pytest
import torch

from commrl.rl import grpo
from commrl.rl.config import RLConfig


def test_advantages_are_group_normalised_scores():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    mask = torch.ones(6, 3)
    mask[1, 2] = 0
    uids = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    adv = grpo.grpo_advantages(scores, mask, uids)
    a = scores[:3]
    expected = (a - a.mean()) / (a.std() + 1e-6)
    assert torch.allclose(adv[:3, 0], expected, atol=1e-5)
    assert torch.all(adv[1, 2] == 0)  # masked position carries no advantage
    assert torch.allclose(adv[0], adv[0, 0].expand(3))  # outcome advantage broadcast over the response


def test_loss_is_verl_clipped_objective_plus_kl():
    torch.manual_seed(0)
    rl = RLConfig(
        prompts_per_tick=2, group_size=2, mini_batches=1, micro_batch_size=4, kl_coef=0.1, clip_ratio=0.2
    )
    cfg = grpo.actor_config(rl, 4)
    mask = torch.ones(4, 5)
    mask[0, 3:] = 0
    old = torch.randn(4, 5) - 2
    new = old + 0.5 * torch.randn(4, 5)
    ref = old - 0.1
    adv = torch.randn(4, 1).expand(4, 5).clone()
    grpo.set_global_batch(cfg, mask)
    loss, metrics = grpo.grpo_loss(cfg, new, old, ref, adv, mask)
    ratio = (new - old).exp()
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * 3.0), pg)
    d = ref - new
    k3 = (d.exp() - d - 1).clamp(-10, 10)
    expected = (pg * mask).sum() / mask.sum() + 0.1 * (k3 * mask).sum() / mask.sum()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert 0 < metrics["actor/pg_clipfrac"] < 1


def test_micro_batch_losses_sum_to_the_mini_batch_mean():
    torch.manual_seed(1)
    rl = RLConfig(prompts_per_tick=2, group_size=2, mini_batches=1, micro_batch_size=2, kl_coef=0.0)
    cfg = grpo.actor_config(rl, 4)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], dtype=torch.float)
    lp, adv = torch.randn(4, 3), torch.randn(4, 3)
    grpo.set_global_batch(cfg, mask)
    whole, _ = grpo.grpo_loss(cfg, lp, lp, None, adv, mask)
    parts = sum(
        grpo.grpo_loss(cfg, lp[s], lp[s], None, adv[s], mask[s])[0] for s in (slice(0, 2), slice(2, 4))
    )
    assert float(parts) == pytest.approx(float(whole), rel=1e-6)
