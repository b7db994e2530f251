"""Shared-prefix packing: the trainer's packed forward equals the padded layout's, values and gradients."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from commrl.compression import MethodConfig, TwoCircuitController
from commrl.rl.batch import build_batch
from commrl.rl.logprobs import response_log_probs
from commrl.rl.packing import pack_shared_prefix, use_shared_prefix_attention
from commrl.rl.sampler import Completion


def _groups(seed: int, n_prompts: int = 5, n: int = 4):
    rng = random.Random(seed)
    prompts = [[rng.randrange(4, 90) for _ in range(rng.randrange(3, 9))] for _ in range(n_prompts)]
    groups = []
    for _ in prompts:
        lengths = [rng.choice([0, 1, 4, 7]) for _ in range(n)]
        groups.append([Completion([rng.randrange(4, 90) for _ in range(k)], [0.0] * k) for k in lengths])
    return prompts, groups


def _padded_log_probs(model, batch):
    """The reference: one padded ``[prompt | response]`` row per completion, plain sdpa."""
    out = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    )
    r = batch.response_length
    logits = out.logits[:, -r - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)


def test_pack_lays_each_prompt_once_and_restarts_positions():
    prompts = [[5, 6, 7], [8]]
    groups = [[Completion([1, 2], [0, 0]), Completion([3], [0])], [Completion([], []), Completion([9], [0])]]
    b = build_batch(prompts, groups, pad_id=0, tick=0)
    pack = b.pack()
    assert pack.input_ids.tolist() == [[5, 6, 7, 1, 2, 3, 8, 9]]
    assert pack.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 0, 1]]
    # the logits predicting response token t: the prompt's last token for t = 0, else response token t - 1
    assert pack.predictors[0].tolist() == [2, 3]
    assert pack.predictors[1, 0].item() == 2 and pack.predictors[3, 0].item() == 6
    assert pack.row_prompt.tolist() == [0, 0, 1, 1]
    assert pack.token_mask.shape == (1, 8)


def test_rows_naming_one_prompt_must_carry_its_tokens():
    ids = torch.tensor([[5, 6, 1], [5, 7, 1]])
    with pytest.raises(ValueError, match="share prompt id 0"):
        pack_shared_prefix(ids, torch.ones_like(ids), 1, [0, 0])


@pytest.mark.parametrize("seed", [0, 1])
def test_packed_log_probs_and_gradients_equal_the_padded_layout(small_model, seed):
    padded = AutoModelForCausalLM.from_pretrained(small_model, attn_implementation="sdpa")
    packed = copy.deepcopy(padded)
    use_shared_prefix_attention(packed)
    batch = build_batch(*_groups(seed), pad_id=0, tick=0)
    pack = batch.pack()
    assert pack.tokens < batch.attention_mask.sum()  # each prompt once, no padding
    mask = batch.response_mask.bool()
    want, got = _padded_log_probs(padded, batch), response_log_probs(packed, pack, batch.responses)
    assert torch.allclose(want[mask], got[mask], atol=1e-5)
    (want * batch.response_mask).sum().backward()
    (got * batch.response_mask).sum().backward()
    for (name, a), b in zip(padded.named_parameters(), packed.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-4), name


def test_the_low_rank_codec_sees_the_same_tokens_packed(small_model):
    """The codec is token-wise: through it the packed forward still equals the padded one."""
    padded = AutoModelForCausalLM.from_pretrained(small_model, attn_implementation="sdpa").eval()
    packed = copy.deepcopy(padded)
    use_shared_prefix_attention(packed)
    method = MethodConfig(codec="lowrank", rank=4, anchor=False)
    ctrl_padded, ctrl_packed = TwoCircuitController(padded, method), TwoCircuitController(packed, method)
    batch = build_batch(*_groups(2), pad_id=0, tick=0)
    pack = batch.pack()
    with torch.no_grad():
        with ctrl_padded.compressed(token_mask=batch.attention_mask.bool()):
            want = _padded_log_probs(padded, batch)
        with ctrl_packed.compressed(token_mask=pack.token_mask):
            got = response_log_probs(packed, pack, batch.responses)
    mask = batch.response_mask.bool()
    assert torch.allclose(want[mask], got[mask], atol=1e-5)


def test_generate_on_the_switched_model_is_unchanged(small_model):
    """Without a pack the attention is plain sdpa: greedy decoding of padded prompts is the same."""
    plain = AutoModelForCausalLM.from_pretrained(small_model, attn_implementation="sdpa").eval()
    switched = copy.deepcopy(plain)
    use_shared_prefix_attention(switched)
    ids = torch.tensor([[0, 0, 4, 50, 51], [4, 60, 61, 62, 63]])
    kwargs = {"attention_mask": (ids != 0).long(), "max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(plain.generate(ids, **kwargs), switched.generate(ids, **kwargs))


def test_log_probs_need_the_shared_prefix_attention(small_model):
    model = AutoModelForCausalLM.from_pretrained(small_model, attn_implementation="sdpa")
    batch = build_batch(*_groups(3), pad_id=0, tick=0)
    with pytest.raises(ValueError, match="use_shared_prefix_attention"):
        response_log_probs(model, batch.pack(), batch.responses)
