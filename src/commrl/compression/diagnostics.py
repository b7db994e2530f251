"""Read-outs of the fast circuit (method.md §4): gradient cosines and model-level sums over ranks.

A sum over a model's parameters runs over each rank's local shards; ``RankSums`` keeps the partial sums of
row-sharded tensors apart from those of replicated (or unsharded) ones, so that only the sharded part is
summed over the data-parallel group and a replicated tensor is not counted once per rank.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor


def _work(t: Tensor) -> Tensor:
    flat = t.detach().reshape(-1)
    return flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat


def cosine_terms(a: Tensor, b: Tensor) -> Tensor:
    """``(a . b, a . a, b . b)`` of two same-shaped tensors (or shards), as a float64 triple.

    Summed over tensors and ranks, the triple gives the cosine of the concatenated vectors (``cosine``).
    """
    x, y = _work(a), _work(b)
    return torch.stack([torch.dot(x, y), torch.dot(x, x), torch.dot(y, y)]).double()


def cosine(terms: Tensor) -> float:
    """``cos(a, b) = a . b / (||a|| ||b||)`` from summed ``cosine_terms``; 0 when either vector is zero."""
    dot, aa, bb = terms.tolist()
    norms = math.sqrt(aa) * math.sqrt(bb)
    return dot / norms if norms > 0 else 0.0


def squared_norm(t: Tensor) -> Tensor:
    """``||t||_2^2`` as a one-element float64 tensor (summed over tensors and ranks: a global norm)."""
    x = _work(t)
    return torch.dot(x, x).double().reshape(1)


class RankSums:
    """Partial sums of local shards: ``add`` per tensor, ``total`` once over the process group.

    Every rank must call ``total`` at the same point (it all-reduces the row-sharded part when there is
    one); it returns None when nothing was added.
    """

    def __init__(self) -> None:
        self.sharded: Tensor | None = None
        self.replicated: Tensor | None = None

    def add(self, terms: Tensor, sharded: bool) -> None:
        if sharded:
            self.sharded = terms if self.sharded is None else self.sharded + terms
        else:
            self.replicated = terms if self.replicated is None else self.replicated + terms

    def total(self, group: dist.ProcessGroup | None) -> Tensor | None:
        sharded, replicated = self.sharded, self.replicated
        self.sharded = self.replicated = None
        if sharded is not None and group is not None:
            dist.all_reduce(sharded, group=group)
        if sharded is None:
            return replicated
        return sharded if replicated is None else sharded + replicated.to(sharded.device)
