"""Token log-probabilities of the responses under a causal LM (the trainer's forward pass)."""

from __future__ import annotations

import torch
from torch import nn

from commrl.rl.packing import ATTENTION_NAME, SharedPrefixPack


def response_log_probs(
    model: nn.Module, pack: SharedPrefixPack, responses: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``log pi(response_t | prefix)`` at temperature ``T``: ``log_softmax(logits / T)`` gathered at the
    response tokens, shape ``[B, R]`` (padding positions hold garbage; mask them with ``response_mask``).

    One forward over the shared-prefix ``pack`` of the rows (``commrl.rl.packing``); ``model`` must run the
    ``shared_prefix`` attention (``use_shared_prefix_attention``).
    """
    if model.config._attn_implementation != ATTENTION_NAME:
        raise ValueError(
            f"the model runs {model.config._attn_implementation!r} attention; call "
            "commrl.rl.packing.use_shared_prefix_attention(model) before packed forwards"
        )
    out = model(
        input_ids=pack.input_ids,
        position_ids=pack.position_ids,
        attention_mask=torch.ones_like(pack.input_ids),
        prefix_pack=pack,
    )
    logits = out.logits[0, pack.predictors].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
