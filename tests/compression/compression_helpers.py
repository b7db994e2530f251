"""Helpers of the compression tests: a tiny Qwen2 (hidden 64, 2 layers, 2 heads), a per-tick batch."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB = 48
HIDDEN = 64


def tiny_qwen2(seed: int = 0, layers: int = 2) -> Qwen2ForCausalLM:
    """A float32 Qwen2 small enough for unit tests (vLLM head sizes are not needed here)."""
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).float()


def batch_for_tick(
    tick: int, microbatch: int = 0, batch: int = 3, length: int = 10
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and a left-padding mask, a pure function of (tick, micro-batch)."""
    gen = torch.Generator().manual_seed(1000 * tick + microbatch)
    ids = torch.randint(3, VOCAB, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[0, :3] = False
    mask[1, :1] = False
    return ids, mask


def lm_loss(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy over real tokens (stands in for the GRPO loss: any differentiable loss)."""
    logits = model(input_ids=ids, attention_mask=mask.long()).logits[:, :-1]
    targets = ids[:, 1:].masked_fill(~mask[:, 1:], -100)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
