"""The sampler's weight versions under asynchronous training (``rl.staleness: k``).

Version ``v`` is the policy after ``v`` ticks (the trainer's weights at the start of tick ``v``). Tick ``t``
trains on rollouts sampled with version ``behaviour_version(t, k) = max(0, t - k)``: a one-step-off-policy
pipeline (the sampler generates batch t + 1 while the trainer trains on batch t) is ``k = 1``. The history
keeps the last ``k + 1`` versions (CPU copies), is part of the trainer's checkpoint, and so a resumed run
samples with exactly the weights an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


def behaviour_version(tick: int, staleness: int) -> int:
    """The weight version that samples tick ``tick``'s rollouts: ``max(0, tick - k)``."""
    return max(0, tick - staleness)


class WeightHistory:
    """The newest ``staleness + 1`` weight versions of the policy, by version number."""

    def __init__(self, staleness: int):
        self.staleness = staleness
        self.versions: dict[int, dict[str, torch.Tensor]] = {}

    def record(self, version: int, model: nn.Module) -> None:
        """Keep a copy of ``model``'s weights as ``version``; drop versions no tick will sample with."""
        if self.staleness == 0:
            return
        self.versions[version] = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        for old in [v for v in self.versions if v < version - self.staleness]:
            del self.versions[old]

    def get(self, version: int) -> Mapping[str, torch.Tensor]:
        if version not in self.versions:
            raise KeyError(
                f"weight version {version} is not in the sampler's history (kept: {sorted(self.versions)}); "
                "a checkpoint written before rl.staleness was set cannot resume with it"
            )
        return self.versions[version]

    def state_dict(self) -> dict[str, Any]:
        return {"staleness": self.staleness, "versions": self.versions}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["staleness"]) != self.staleness:
            raise ValueError(
                f"the checkpoint was written with rl.staleness={state['staleness']}, this run has "
                f"{self.staleness}; resume with the run's own setting"
            )
        self.versions = {int(v): dict(w) for v, w in state["versions"].items()}
