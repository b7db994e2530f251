"""The anchor's stale view and weight projection (method.md §3.1-§3.2).

Snapshots of the weights are taken at every fire; at tick ``t_now`` the anchor sees those with
``tick <= t_now - h``. Every projection has the form

    theta_proj = theta_n + s * (f(t_now) - f(tau_n))

with ``theta_n`` the newest visible snapshot (taken at ``tau_n``) and ``f`` a trajectory fitted to the
newest visible snapshots **(reading: the fit moves the newest snapshot, it does not replace it)**:

- ``none``: ``theta_n`` as it is (one snapshot);
- ``secant`` / ``progressive``: the line through the two newest, i.e.
  ``theta_n + s * ((t_now - tau_n) / Delta) * (theta_n - theta_{n-1})``; ``progressive`` ramps ``s``
  from 0 to its value over the first ``progressive_fires`` fires that have two snapshots;
- ``quad4``: the degree-2 least-squares polynomial through the four newest (exact on quadratic
  trajectories; degree 2 rather than the exact cubic, the smoother of the two "higher-order fits");
- ``relex``: over the ``T`` newest, the deltas from the oldest of them, their top singular direction ``v``
  (from the Gram matrix of the deltas), the coefficients ``c_i = delta_i . v`` fitted linearly in time;
  ``f(t_now) - f(tau_n) = b (t_now - tau_n) v`` with ``b`` the fitted slope. ``T = 2`` is the secant.

With fewer visible snapshots than the fit needs, the newest visible one is used as it is; with none, the
live weights (the caller's fallback).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from commrl.compression.config import PROJECTIONS


def snapshots_needed(projection: str, relex_window: int) -> int:
    """How many visible snapshots a projection's fit uses."""
    needed = {"none": 1, "secant": 2, "progressive": 2, "quad4": 4, "relex": relex_window}
    if projection not in needed:
        raise ValueError(f"projection={projection!r} is not one of {', '.join(PROJECTIONS)}")
    return needed[projection]


def progressive_scale(scale: float, ramp_index: int, progressive_fires: int) -> float:
    """``s * min(1, i / progressive_fires)`` for the ``i``-th (0-based) fire with a secant: 0, 1/n, ..., 1."""
    return scale * min(1.0, ramp_index / progressive_fires)


def _work_dtype(t: Tensor) -> torch.dtype:
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def secant_projection(
    theta_t: Tensor, theta_prev: Tensor, tau_t: int, tau_prev: int, t_now: int, scale: float
) -> Tensor:
    """``theta_proj = theta_t + s * ((t_now - tau_t) / Delta) * (theta_t - theta_{t-1})``.

    ``Delta = tau_t - tau_prev``, the ticks between the two snapshots.

    method.md §3.2: with snapshots every ``K`` ticks and ``h = K`` this is ``theta_t + s (h / K) (...)``.
    """
    delta_ticks = tau_t - tau_prev
    if delta_ticks <= 0:
        raise ValueError(f"secant needs tau_t > tau_prev, got {tau_t} and {tau_prev}")
    dtype = _work_dtype(theta_t)
    a, b = theta_t.to(dtype), theta_prev.to(dtype)
    return (a + (scale * (t_now - tau_t) / delta_ticks) * (a - b)).to(theta_t.dtype)


def polyfit_increment_weights(taus: Sequence[int], t_now: int, degree: int) -> list[float]:
    """Weights ``w`` with ``f(t_now) - f(tau_n) = sum_i w_i theta_i`` for the least-squares polynomial ``f``
    of ``degree`` through the points ``(tau_i, theta_i)``; ``tau_n = taus[-1]``. ``sum_i w_i = 0``."""
    if len(taus) <= degree:
        raise ValueError(f"a degree-{degree} fit needs more than {degree} points, got {len(taus)}")
    span = float(max(taus) - min(taus)) or 1.0
    x = (torch.tensor(taus, dtype=torch.float64) - taus[-1]) / span
    vander = torch.stack([x**k for k in range(degree + 1)], dim=1)
    x_now = (t_now - taus[-1]) / span
    row = torch.tensor([x_now**k - (0.0 if k else 1.0) for k in range(degree + 1)], dtype=torch.float64)
    return (row @ torch.linalg.pinv(vander)).tolist()


def quad4_projection(thetas: Sequence[Tensor], taus: Sequence[int], t_now: int, scale: float) -> Tensor:
    """``theta_n + s * (f(t_now) - f(tau_n))``, ``f`` the degree-2 least-squares fit to 4 snapshots (§3.2)."""
    weights = polyfit_increment_weights(taus, t_now, degree=2)
    dtype = _work_dtype(thetas[-1])
    newest = thetas[-1].to(dtype)
    out = newest.clone()
    for w, theta in zip(weights, thetas, strict=True):
        out.add_(theta.to(dtype) - newest, alpha=scale * w)
    return out.to(thetas[-1].dtype)


def relex_gram(thetas: Sequence[Tensor]) -> Tensor:
    """Gram matrix ``D D^T`` (float64) of the deltas ``delta_i = theta_i - theta_0``, i = 1..T-1.

    For row-sharded tensors the caller sums it over the shards before ``relex_projection``.
    """
    base = thetas[0].double()
    deltas = torch.stack([(theta.double() - base).reshape(-1) for theta in thetas[1:]])
    return deltas @ deltas.T


def relex_projection(
    thetas: Sequence[Tensor], taus: Sequence[int], t_now: int, scale: float, gram: Tensor | None = None
) -> Tensor:
    """RELEX rank-one extrapolation (method.md §3.2): ``theta_n + s * b * (t_now - tau_n) * v``.

    ``v = D^T u / sqrt(lambda)`` with ``(lambda, u)`` the top eigenpair of ``gram = D D^T``; the
    coefficients ``c_i = delta_i . v = sqrt(lambda) u_i`` (``c_0 = 0`` for the base) are fitted by a line
    in time with slope ``b``. Zero deltas leave ``theta_n`` unchanged.
    """
    if gram is None:
        gram = relex_gram(thetas)
    evals, evecs = torch.linalg.eigh(gram)
    lam, u = float(evals[-1]), evecs[:, -1]
    newest = thetas[-1]
    if lam <= 0.0:
        return newest.clone()
    coeffs = torch.cat([torch.zeros(1, dtype=torch.float64), lam**0.5 * u.cpu()])
    t = torch.tensor(taus, dtype=torch.float64)
    t_c = t - t.mean()
    slope = float((t_c * (coeffs - coeffs.mean())).sum() / t_c.square().sum())
    step = scale * slope * (t_now - taus[-1]) / lam**0.5
    dtype = _work_dtype(newest)
    base = thetas[0].to(dtype)
    out = newest.to(dtype).clone()
    for u_i, theta in zip(u.tolist(), thetas[1:], strict=True):
        out.add_(theta.to(dtype) - base, alpha=step * u_i)
    return out.to(newest.dtype)


def project_tensor(
    projection: str,
    thetas: Sequence[Tensor],
    taus: Sequence[int],
    t_now: int,
    scale: float,
    relex_window: int = 4,
    gram: Tensor | None = None,
) -> Tensor:
    """One tensor's ``theta_proj`` from its newest visible snapshots (oldest first), by ``projection``.

    ``progressive`` is the secant with the caller's ramped ``scale``. Too few snapshots: the newest.
    """
    if not thetas:
        raise ValueError("no visible snapshot: use the live weights")
    needed = snapshots_needed(projection, relex_window)
    if projection == "none" or len(thetas) < needed:
        return thetas[-1]
    thetas, taus = list(thetas)[-needed:], list(taus)[-needed:]
    if projection in ("secant", "progressive"):
        return secant_projection(thetas[1], thetas[0], taus[1], taus[0], t_now, scale)
    if projection == "quad4":
        return quad4_projection(thetas, taus, t_now, scale)
    return relex_projection(thetas, taus, t_now, scale, gram)


class SnapshotBuffer:
    """Tick-stamped copies of the weights (local shards) on ``device``, pruned to what the fit needs."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.snapshots: dict[int, dict[str, Tensor]] = {}

    @torch.no_grad()
    def add(self, tick: int, tensors: Mapping[str, Tensor]) -> None:
        self.snapshots[tick] = {name: t.detach().to(self.device, copy=True) for name, t in tensors.items()}

    def ticks(self) -> list[int]:
        return sorted(self.snapshots)

    def visible(self, t_now: int, delay: int) -> list[int]:
        """Ticks of the snapshots the anchor may see at ``t_now``: ``tick <= t_now - delay``, oldest first."""
        return [tick for tick in self.ticks() if tick <= t_now - delay]

    def __getitem__(self, tick: int) -> dict[str, Tensor]:
        return self.snapshots[tick]

    def __len__(self) -> int:
        return len(self.snapshots)

    def prune(self, t_now: int, delay: int, keep_visible: int) -> None:
        """Keep the ``keep_visible`` newest visible snapshots and every one not yet visible."""
        visible = self.visible(t_now, delay)
        for tick in visible[: max(0, len(visible) - keep_visible)]:
            del self.snapshots[tick]

    def state_dict(self) -> dict[int, dict[str, Tensor]]:
        return {
            tick: {n: t.detach().cpu().clone() for n, t in snap.items()}
            for tick, snap in self.snapshots.items()
        }

    def load_state_dict(self, state: Mapping[int, Mapping[str, Tensor]]) -> None:
        self.snapshots = {
            int(tick): {n: t.to(self.device, copy=True) for n, t in snap.items()}
            for tick, snap in state.items()
        }
