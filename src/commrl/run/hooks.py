"""What code that drives a training run (the sweep) hooks into, for both drivers."""

from __future__ import annotations


class StopTraining(Exception):
    """Raised by a callback (e.g. an Optuna pruner) to end the run early.

    The local trainer checkpoints, ends the MLflow run FINISHED with the tag ``stopped_early`` and returns a
    summary whose ``stopped_early`` holds the reason; the verl sweep driver stops its child process.
    """


class TrainCallbacks:
    """Hooks for code that drives training (the sweep): may raise ``StopTraining``."""

    def on_tick(self, step: int, metrics: dict[str, float]) -> None:
        """After every tick, with that tick's metrics."""

    def on_validation(self, step: int, accuracy: float) -> None:
        """After every validation (step = updates applied so far)."""
