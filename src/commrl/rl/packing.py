"""Shared-prefix packing: the trainer's forward passes over a GRPO group see its prompt once.

A GRPO micro-batch holds ``n`` completions of each prompt. The padded layout (``RolloutBatch``) runs every
row as ``[prompt | response]`` padded to the batch's longest prompt and response, so the model computes each
prompt ``n`` times and every pad token. The packed layout puts one sequence per micro-batch on the token
axis, with no padding:

    [prompt_1, response_1.1, ..., response_1.n, prompt_2, response_2.1, ...]

and its attention is a tree: a prompt token attends causally within its prompt; a response token attends
to its group's whole prompt and causally within its own response. Position ids restart per sequence, so a
response token keeps the position it has in the padded layout. Every token-wise op (embeddings, the
projections and MLPs, norms, the low-rank codec) then runs on ``sum(prompt) + sum(response)`` tokens
instead of ``rows * (P + R)``; the attention itself is two small batched ``sdpa`` calls (prompts, and
responses against their prompt) gathered from and scattered back to the packed axis.

The result is the padded layout's, up to float summation order: the same logits at every response position,
and (autograd through the gathers) the same gradients, a prompt's being the sum over its completions. Under
attention dropout (the ``dropout`` condition) it is not: a group's completions share one dropout draw over
their prompt's tokens, where the padded layout (and verl) draws one per row.

The attention is registered with transformers' ``AttentionInterface`` as ``shared_prefix``; a forward
without a ``prefix_pack`` argument runs plain ``sdpa`` with the usual mask, so ``generate`` and padded
batches work on the same model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ATTENTION_NAME = "shared_prefix"


@dataclass
class SharedPrefixPack:
    """A micro-batch of ``b`` rows (``g`` distinct prompts) packed on one token axis of ``n`` tokens.

    Index tensors point into the packed axis; ``*_valid`` marks the real slots of their padded views.
    """

    input_ids: Tensor  # [1, n]
    position_ids: Tensor  # [1, n]
    prompt_slots: Tensor  # [g, P] packed index of each prompt token (from slot 0, padded on the right)
    prompt_valid: Tensor  # [g, P] bool
    response_slots: Tensor  # [b, R'] packed index of each response token, R' = longest response
    response_valid: Tensor  # [b, R'] bool
    row_prompt: Tensor  # [b] which of the g prompts each row continues
    unpack: Tensor  # [n] row of cat(valid prompt slots, valid response slots) holding each packed token
    predictors: Tensor  # [b, R] packed index of the logits that predict response token t (R = batch width)
    prompt_attention: Tensor  # [g, 1, P, P] bool: causal within the prompt
    response_attention: Tensor  # [b, 1, R', P + R'] bool: the whole prompt, causal within the response

    @property
    def tokens(self) -> int:
        return self.input_ids.shape[1]

    @property
    def token_mask(self) -> Tensor:
        """Every packed token is real: the ``(1, n)`` mask a compression session counts."""
        return torch.ones_like(self.input_ids, dtype=torch.bool)


def pack_shared_prefix(
    input_ids: Tensor, attention_mask: Tensor, response_length: int, prompt_ids: list[int]
) -> SharedPrefixPack:
    """Pack padded rows ``input_ids = [left-padded prompt | right-padded response]`` (``[b, P + R]``).

    ``prompt_ids[i]`` names row ``i``'s prompt; rows with the same id share one copy of it (their prompt
    tokens must match, which is checked).
    """
    width = input_ids.shape[1]
    width_p = width - response_length
    prompt_len = attention_mask[:, :width_p].sum(-1).tolist()
    response_len = attention_mask[:, width_p:].sum(-1).tolist()
    tokens: list[int] = []
    positions: list[int] = []
    group_of: dict[int, int] = {}  # prompt id -> its group (order of first appearance)
    first_row: list[int] = []
    prompt_start: list[int] = []
    row_prompt: list[int] = []
    response_start: list[int] = []
    ids = input_ids.tolist()
    for i, pid in enumerate(prompt_ids):
        p = prompt_len[i]
        prompt = ids[i][width_p - p : width_p]
        if pid not in group_of:
            group_of[pid] = len(first_row)
            first_row.append(i)
            prompt_start.append(len(tokens))
            tokens += prompt
            positions += range(p)
        elif ids[first_row[group_of[pid]]][width_p - p : width_p] != prompt:
            raise ValueError(
                f"rows {first_row[group_of[pid]]} and {i} share prompt id {pid} but not its tokens"
            )
        row_prompt.append(group_of[pid])
        n = response_len[i]
        response_start.append(len(tokens))
        tokens += ids[i][width_p : width_p + n]
        positions += range(p, p + n)
    p_len = torch.tensor([prompt_len[i] for i in first_row])
    r_len = torch.tensor(response_len)
    p_max, r_max = int(p_len.max()), max(1, int(r_len.max()))
    prompt_valid = torch.arange(p_max) < p_len[:, None]
    prompt_slots = torch.where(prompt_valid, torch.tensor(prompt_start)[:, None] + torch.arange(p_max), 0)
    response_valid = torch.arange(r_max) < r_len[:, None]
    response_slots = torch.where(
        response_valid, torch.tensor(response_start)[:, None] + torch.arange(r_max), 0
    )
    order = torch.cat([prompt_slots[prompt_valid], response_slots[response_valid]])
    unpack = torch.empty_like(order)
    unpack[order] = torch.arange(order.numel())
    rows_prompt = torch.tensor(row_prompt)
    # logits at packed position j predict token j + 1: response token 0 is predicted by its prompt's last
    # token, token t > 0 by response token t - 1 (slots past the response point anywhere valid: masked later)
    last_prompt = torch.tensor(prompt_start)[rows_prompt] + p_len[rows_prompt] - 1
    t = torch.arange(response_length)
    previous = torch.tensor(response_start)[:, None] + t[None, :] - 1
    predictors = torch.where(
        t[None, :] == 0, last_prompt[:, None], torch.where(t <= r_len[:, None], previous, 0)
    )
    causal_p = torch.ones(p_max, p_max, dtype=torch.bool).tril()
    causal_r = torch.ones(r_max, r_max, dtype=torch.bool).tril()
    response_attention = torch.cat(
        [
            prompt_valid[rows_prompt][:, None, :].expand(-1, r_max, -1),
            causal_r[None] & response_valid[:, None, :],
        ],
        dim=-1,
    )
    return SharedPrefixPack(
        input_ids=torch.tensor([tokens], dtype=input_ids.dtype),
        position_ids=torch.tensor([positions], dtype=torch.long),
        prompt_slots=prompt_slots,
        prompt_valid=prompt_valid,
        response_slots=response_slots,
        response_valid=response_valid,
        row_prompt=rows_prompt,
        unpack=unpack,
        predictors=predictors,
        prompt_attention=(causal_p[None] & prompt_valid[:, None, :])[:, None],
        response_attention=response_attention[:, None],
    )


def shared_prefix_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    prefix_pack: SharedPrefixPack | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers attention function: the tree attention of ``prefix_pack``, else plain ``sdpa``.

    ``query`` is ``[1, H, n, D]``, ``key``/``value`` ``[1, H_kv, n, D]``; returns ``[1, n, H, D]``.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if prefix_pack is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if sliding_window is not None or query.shape[0] != 1:
        raise ValueError(
            "shared-prefix attention takes one packed sequence (batch 1) and full attention; got batch "
            f"{query.shape[0]}, sliding_window={sliding_window}"
        )
    pack = prefix_pack
    groups = getattr(module, "num_key_value_groups", 1)
    q, k, v = query[0], key[0].repeat_interleave(groups, 0), value[0].repeat_interleave(groups, 0)

    def rows(x: Tensor, slots: Tensor) -> Tensor:  # [H, n, D] -> [rows, H, L, D]
        return x[:, slots].transpose(0, 1)

    kp, vp = rows(k, pack.prompt_slots), rows(v, pack.prompt_slots)
    out_p = F.scaled_dot_product_attention(
        rows(q, pack.prompt_slots), kp, vp, attn_mask=pack.prompt_attention, dropout_p=dropout, scale=scaling
    )
    kr = torch.cat([kp[pack.row_prompt], rows(k, pack.response_slots)], dim=2)
    vr = torch.cat([vp[pack.row_prompt], rows(v, pack.response_slots)], dim=2)
    out_r = F.scaled_dot_product_attention(
        rows(q, pack.response_slots),
        kr,
        vr,
        attn_mask=pack.response_attention,
        dropout_p=dropout,
        scale=scaling,
    )
    flat = torch.cat([out_p.transpose(1, 2)[pack.prompt_valid], out_r.transpose(1, 2)[pack.response_valid]])
    return flat[pack.unpack].unsqueeze(0), None


def use_shared_prefix_attention(model: nn.Module) -> None:
    """Register ``shared_prefix`` with transformers and switch ``model`` to it (unpacked inputs run sdpa)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, shared_prefix_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)
