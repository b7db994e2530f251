"""The trainer's read-outs: method.md §4 names of verl's metrics, and mismatch/* from a step's batch."""

from __future__ import annotations

import pytest
import torch
from verl import DataProto

from commrl.verl_ext.trainer import batch_mismatch, method_metrics


def test_method_metrics_names_verls_metrics():
    verl_step = {
        "critic/score/mean": 0.7,
        "timing_s/step": 30.0,
        "timing_s/gen": 20.0,
        "timing_s/update_actor": 5.0,
        "actor/comm/bytes_total": 10.0,
        "actor/comm/ratio_vs_dense": 0.1,
        "actor/anchor/fire": 1.0,
        "val-core/math500/acc/mean@1": 0.6,
        "val-core/other/acc/mean@1": 0.4,
        "val-aux/math500/score/mean@1": 9.0,
        "actor/pg_loss": 0.3,
    }
    assert method_metrics(verl_step) == {
        "score/mean": 0.7,
        "time/step_s": 30.0,
        "time/sample_s": 20.0,
        "time/train_s": 5.0,
        "comm/bytes_total": 10.0,
        "comm/ratio_vs_dense": 0.1,
        "anchor/fire": 1.0,
        "val/acc": pytest.approx(0.5),
    }
    assert method_metrics({"actor/pg_loss": 1.0}) == {}


def test_batch_mismatch_reads_sampler_against_trainer():
    """Equal log-probs: correlation 1, no gap, none clipped; a 2x ratio on 3 of 5 tokens: clipped at eps."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    lp = torch.tensor([[-0.1, -2.0, -0.5, 0.0], [-1.0, -0.3, 0.0, 0.0]])
    batch = DataProto.from_dict(
        tensors=dict(rollout_log_probs=lp, old_log_probs=lp.clone(), response_mask=mask)
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
