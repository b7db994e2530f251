"""The tick's batch: sampled groups laid out as tensors the trainer's forward passes take.

Layout, as verl's: prompts left-padded to the batch's longest prompt ``P``, responses right-padded to the
longest response ``R``; ``input_ids = [prompt | response]``, ``position_ids = cumsum(attention_mask) - 1``.
Micro-batches are fixed slices of the batch with stable ids, so every pass over the same sequences (old,
reference and training log-probs) sees the same codec randomness.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from commrl.rl.packing import SharedPrefixPack, pack_shared_prefix
from commrl.rl.sampler import Completion


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    position_ids: torch.Tensor  # [B, P + R]
    responses: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R] float
    sampler_log_probs: torch.Tensor  # [B, R]
    uids: np.ndarray  # [B] group id of each sequence (object array, as verl's `uid`)
    prompt_index: list[int]  # [B] index of the prompt in the tick's prompt list

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_length(self) -> int:
        return self.responses.shape[1]

    def pack(self) -> SharedPrefixPack:
        """The rows packed with one copy of each prompt (the layout of the trainer's forward passes)."""
        return pack_shared_prefix(
            self.input_ids, self.attention_mask, self.response_length, self.prompt_index
        )

    def rows(self, idx: slice) -> RolloutBatch:
        return RolloutBatch(
            self.input_ids[idx],
            self.attention_mask[idx],
            self.position_ids[idx],
            self.responses[idx],
            self.response_mask[idx],
            self.sampler_log_probs[idx],
            self.uids[idx],
            self.prompt_index[idx],
        )


def build_batch(
    prompts: Sequence[Sequence[int]], groups: Sequence[Sequence[Completion]], pad_id: int, tick: int
) -> RolloutBatch:
    """Lay ``groups[i]`` (the completions of ``prompts[i]``) out as one padded batch."""
    rows = [(i, list(prompts[i]), c) for i, group in enumerate(groups) for c in group]
    width_p = max(len(p) for _, p, _ in rows)
    width_r = max(1, max(len(c.token_ids) for _, _, c in rows))
    b = len(rows)
    input_ids = torch.full((b, width_p + width_r), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width_p + width_r), dtype=torch.long)
    sampler_lp = torch.zeros((b, width_r), dtype=torch.float32)
    for k, (_, p, c) in enumerate(rows):
        input_ids[k, width_p - len(p) : width_p] = torch.tensor(p, dtype=torch.long)
        attention[k, width_p - len(p) : width_p] = 1
        if c.token_ids:
            n = len(c.token_ids)
            input_ids[k, width_p : width_p + n] = torch.tensor(c.token_ids, dtype=torch.long)
            attention[k, width_p : width_p + n] = 1
            sampler_lp[k, :n] = torch.tensor(c.logprobs, dtype=torch.float32)
    position_ids = torch.clamp(torch.cumsum(attention, dim=-1) - 1, min=0)
    uids = np.array([f"t{tick}-p{i}" for i, _, _ in rows], dtype=object)
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=position_ids,
        responses=input_ids[:, width_p:],
        response_mask=attention[:, width_p:].float(),
        sampler_log_probs=sampler_lp,
        uids=uids,
        prompt_index=[i for i, _, _ in rows],
    )


def micro_batches(
    batch: RolloutBatch, size: int, start: int = 0, stop: int | None = None
) -> Iterator[tuple[int, RolloutBatch]]:
    """``(microbatch_id, rows)`` over ``batch[start:stop]`` in slices of ``size``; ids are global."""
    stop = batch.size if stop is None else stop
    for lo in range(start, stop, size):
        yield lo // size, batch.rows(slice(lo, min(lo + size, stop)))
