"""Train/inference mismatch read-outs (method.md §4): sampler against trainer log-probs at sampled tokens."""

from __future__ import annotations

import torch

ASYNC_BANDS = {"mismatch/async_clip_frac_eps0.2": (0.8, 1.2), "mismatch/async_clip_frac_5x": (0.2, 5.0)}


def mismatch_metrics(
    sampler_lp: torch.Tensor, trainer_lp: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Over the response tokens selected by ``mask``:

    - ``mismatch/logprob_corr``: Pearson correlation of sampler and trainer log-probs;
    - ``mismatch/prob_gap``: mean ``|p_sampler - p_trainer|``;
    - ``mismatch/async_clip_frac_*``: the fraction of tokens whose ratio ``pi_trainer / pi_sampler`` leaves
      ``[0.8, 1.2]`` and ``[0.2, 5]`` (what an asynchronous trainer reusing the sampler's log-probs clips).
    """
    m = mask.bool()
    s = sampler_lp[m].double()
    t = trainer_lp[m].double()
    out = {
        "mismatch/logprob_corr": pearson(s, t),
        "mismatch/prob_gap": float((s.exp() - t.exp()).abs().mean()),
    }
    ratio = (t - s).clamp(-30, 30).exp()
    for name, (lo, hi) in ASYNC_BANDS.items():
        out[name] = float(((ratio < lo) | (ratio > hi)).double().mean())
    return out


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation; 1.0 when both are constant and equal, 0.0 when one is constant."""
    xc, yc = x - x.mean(), y - y.mean()
    den = float(xc.norm() * yc.norm())
    if den == 0.0:
        return 1.0 if torch.allclose(x, y) else 0.0
    return float((xc * yc).sum()) / den
