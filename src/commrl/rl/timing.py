"""Where one training process spends its wall time: seconds per phase (set-up, sampling, training, ...)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = (
    "setup_models",
    "setup_sampler",
    "tracking",
    "sample",
    "train",
    "push_weights",
    "validate",
    "checkpoint",
)


class PhaseTimer:
    """Accumulates wall seconds per phase: ``with timer.phase("validate"): ...`` or ``timer.add(name, s)``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        if name not in self.seconds:
            raise KeyError(f"unknown phase {name!r}; one of {', '.join(PHASES)}")
        self.seconds[name] += seconds

    def as_dict(self) -> dict[str, float]:
        return {name: round(value, 3) for name, value in self.seconds.items()}
