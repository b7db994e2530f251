"""Token log-probabilities of the responses under a causal LM (the trainer's forward pass)."""

from __future__ import annotations

import torch
from torch import nn

from commrl.rl.batch import RolloutBatch


def response_log_probs(model: nn.Module, batch: RolloutBatch, temperature: float = 1.0) -> torch.Tensor:
    """``log pi(response_t | prefix) `` at temperature ``T``: ``log_softmax(logits / T)`` gathered at the
    response tokens, shape ``[B, R]`` (padding positions hold garbage; mask them with ``response_mask``)."""
    out = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    )
    r = batch.response_length
    logits = out.logits[:, -r - 1 : -1, :].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)
