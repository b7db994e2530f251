"""Weight projections: secant exact on lines, quad4 exact on parabolas, relex T=2 == secant, fallbacks."""

from __future__ import annotations

import pytest
import torch

from commrl.compression import SnapshotBuffer, project_tensor, relex_projection, secant_projection
from commrl.compression.projection import polyfit_increment_weights, progressive_scale, relex_gram

GEN = torch.Generator().manual_seed(0)
A, B, C = (torch.randn(5, 3, generator=GEN, dtype=torch.float64) for _ in range(3))


def line(t: float) -> torch.Tensor:
    return A + t * B


def parabola(t: float) -> torch.Tensor:
    return A + t * B + t * t * C


def test_secant_is_exact_on_linear_trajectories():
    # note's form: snapshots K apart, h = K: theta_t + (h / K) (theta_t - theta_{t-1})
    torch.testing.assert_close(secant_projection(line(40), line(20), 40, 20, 60, 1.0), line(60))
    torch.testing.assert_close(secant_projection(line(40), line(30), 40, 30, 47, 1.0), line(47))
    torch.testing.assert_close(secant_projection(line(40), line(20), 40, 20, 60, 0.5), line(50))
    assert (secant_projection(parabola(40), parabola(20), 40, 20, 60, 1.0) - parabola(60)).abs().max() > 1


def test_quad4_is_exact_on_quadratic_trajectories():
    taus = [0, 20, 40, 60]
    thetas = [parabola(t) for t in taus]
    torch.testing.assert_close(project_tensor("quad4", thetas, taus, 80, 1.0), parabola(80))
    torch.testing.assert_close(project_tensor("quad4", thetas, [0, 20, 40, 60], 73, 1.0), parabola(73))
    assert sum(polyfit_increment_weights(taus, 80, 2)) == pytest.approx(0.0, abs=1e-12)
    # a line is not enough: the secant misses the curvature
    assert (project_tensor("secant", thetas, taus, 80, 1.0) - parabola(80)).abs().max() > 1


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_relex_with_two_snapshots_is_the_secant(scale):
    theta_prev, theta_t = torch.randn(7, 4, generator=GEN), torch.randn(7, 4, generator=GEN)
    relex = relex_projection([theta_prev, theta_t], [20, 40], 60, scale)
    torch.testing.assert_close(relex, secant_projection(theta_t, theta_prev, 40, 20, 60, scale))


def test_relex_extrapolates_rank_one_trajectories_and_uses_a_summed_gram():
    """theta(t) = base + c(t) v, c linear: exact; the Gram can be given (as shards summed over ranks)."""
    base, v = (torch.randn(6, 4, generator=GEN, dtype=torch.float64) for _ in range(2))
    taus = [0, 10, 20, 30]
    thetas = [base + (0.5 + 0.1 * t) * v for t in taus]
    torch.testing.assert_close(relex_projection(thetas, taus, 45, 1.0), base + (0.5 + 4.5) * v)
    top, bottom = [t[:3] for t in thetas], [t[3:] for t in thetas]
    gram = relex_gram(top) + relex_gram(bottom)
    torch.testing.assert_close(
        relex_projection(top, taus, 45, 1.0, gram), relex_projection(thetas, taus, 45, 1.0)[:3]
    )


def test_too_few_snapshots_fall_back_to_the_newest():
    taus = [0, 20, 40]
    thetas = [line(t) for t in taus]
    assert project_tensor("quad4", thetas, taus, 60, 1.0) is thetas[-1]
    assert project_tensor("relex", thetas, taus, 60, 1.0, relex_window=4) is thetas[-1]
    assert project_tensor("secant", thetas[:1], taus[:1], 60, 1.0) is thetas[0]
    assert project_tensor("none", thetas, taus, 60, 1.0) is thetas[-1]
    torch.testing.assert_close(project_tensor("relex", thetas, taus, 60, 1.0, relex_window=3), line(60))
    with pytest.raises(ValueError, match="live weights"):
        project_tensor("secant", [], [], 60, 1.0)


def test_progressive_ramps_from_zero_to_one():
    assert [progressive_scale(1.0, i, 3) for i in range(5)] == pytest.approx([0, 1 / 3, 2 / 3, 1, 1])


def test_snapshot_buffer_visibility_and_pruning():
    buffer = SnapshotBuffer("cpu")
    for tick in (0, 20, 40, 60):
        buffer.add(tick, {"w": torch.full((2,), float(tick))})
    assert buffer.visible(60, 20) == [0, 20, 40]
    assert buffer.visible(60, 0) == [0, 20, 40, 60]
    buffer.prune(60, 20, keep_visible=2)  # the secant needs the 2 newest visible; 60 is not visible yet
    assert buffer.ticks() == [20, 40, 60]
    restored = SnapshotBuffer("cpu")
    restored.load_state_dict(buffer.state_dict())
    assert restored.ticks() == [20, 40, 60] and torch.equal(restored[40]["w"], torch.full((2,), 40.0))
