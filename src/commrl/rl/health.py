"""Run health: non-finite losses and the collapse early warning (``health/alarm``).

The note's collapse shows up before accuracy falls: the trainer/reference KL climbs, the clip fraction
accelerates and the sampler/trainer log-prob correlation drops. ``CollapseMonitor`` watches the three
over a trailing window and raises the alarm when any crosses its threshold (``HealthConfig``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

from commrl.rl.config import HealthConfig


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; the message names the tick."""


def least_squares_slope(values: list[float]) -> float:
    """Slope of the least-squares line through ``(i, values[i])``."""
    n = len(values)
    if n < 2:
        return 0.0
    xm, ym = (n - 1) / 2, sum(values) / n
    num = sum((i - xm) * (v - ym) for i, v in enumerate(values))
    den = sum((i - xm) ** 2 for i in range(n))
    return num / den


class CollapseMonitor:
    """Trailing-window checks of KL slope, clip-fraction acceleration and log-prob correlation drop."""

    def __init__(self, cfg: HealthConfig):
        self.cfg = cfg
        self.kl: deque[float] = deque(maxlen=cfg.window)
        self.clip: deque[float] = deque(maxlen=cfg.window)
        self.corr: deque[float] = deque(maxlen=cfg.window)
        self.corr_reference: float | None = None
        self._corr_first: list[float] = []

    def update(self, metrics: Mapping[str, float]) -> list[str]:
        """Feed one tick's metrics; returns the reasons of an alarm (empty when healthy). A fire tick's clip
        fraction is left out, and the clip check waits for the next fast tick: the anchor's replay is ratio
        one, so its 0 says nothing of the trend."""
        fire = metrics.get("anchor/fire") == 1.0
        feeds = [("actor/kl_loss", self.kl), ("mismatch/logprob_corr", self.corr)]
        if not fire:
            feeds.append(("actor/pg_clipfrac", self.clip))
        for key, buf in feeds:
            value = metrics.get(key)
            if value is not None and math.isfinite(value):
                buf.append(float(value))
        if self.corr_reference is None and "mismatch/logprob_corr" in metrics:
            self._corr_first.append(float(metrics["mismatch/logprob_corr"]))
            if len(self._corr_first) == self.cfg.window:
                self.corr_reference = sum(self._corr_first) / len(self._corr_first)
        reasons = []
        if len(self.kl) == self.cfg.window and least_squares_slope(list(self.kl)) > self.cfg.kl_slope:
            reasons.append(
                f"KL slope {least_squares_slope(list(self.kl)):.3f} > {self.cfg.kl_slope} nats/tick"
            )
        if not fire and len(self.clip) == self.cfg.window:
            c = list(self.clip)
            accel = sum(c[i + 1] - 2 * c[i] + c[i - 1] for i in range(1, len(c) - 1)) / (len(c) - 2)
            if accel > self.cfg.clipfrac_accel:
                reasons.append(f"clip-fraction acceleration {accel:.4f} > {self.cfg.clipfrac_accel}")
        if self.corr_reference is not None and len(self.corr) == self.cfg.window:
            drop = self.corr_reference - sum(self.corr) / len(self.corr)
            if drop > self.cfg.corr_drop:
                reasons.append(f"log-prob correlation dropped by {drop:.3f} > {self.cfg.corr_drop}")
        return reasons

    def state_dict(self) -> dict:
        return {
            "kl": list(self.kl),
            "clip": list(self.clip),
            "corr": list(self.corr),
            "corr_reference": self.corr_reference,
            "corr_first": list(self._corr_first),
        }

    def load_state_dict(self, state: dict) -> None:
        self.kl.extend(state["kl"])
        self.clip.extend(state["clip"])
        self.corr.extend(state["corr"])
        self.corr_reference = state["corr_reference"]
        self._corr_first = list(state["corr_first"])


def check_finite(loss: float, step: int) -> None:
    if not math.isfinite(loss):
        raise NonFiniteLossError(f"non-finite loss ({loss}) at tick {step}")
