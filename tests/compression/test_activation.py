"""Activation codecs: low-rank exactness, basis refresh (power iteration), the PRF mask."""

from __future__ import annotations

import math

import pytest
import torch

from commrl.compression import (
    LowRankActivationCodec,
    PRFMaskActivationCodec,
    energy_captured,
    lowrank_project,
    orth,
    prf_key,
    prf_mask,
    prf_uniform,
    random_orthonormal,
    sketch_step,
    sketch_update,
)

GEN = torch.Generator().manual_seed(0)


def test_lowrank_reproduces_inputs_in_the_span_exactly():
    Q = orth(torch.randn(64, 8, generator=GEN, dtype=torch.float64))
    A = torch.randn(2, 5, 8, generator=GEN, dtype=torch.float64) @ Q.T  # rows in span(Q)
    torch.testing.assert_close(lowrank_project(A, Q), A, atol=1e-12, rtol=0)
    outside = torch.randn(10, 64, generator=GEN, dtype=torch.float64)
    assert (lowrank_project(outside, Q) - outside).norm() > 0.5 * outside.norm()


def test_lowrank_backward_is_projected_too():
    Q = random_orthonormal(16, 4, seed=2)
    A = torch.randn(6, 16, generator=GEN, requires_grad=True)
    upstream = torch.randn(6, 16, generator=GEN)
    (lowrank_project(A, Q) * upstream).sum().backward()
    torch.testing.assert_close(A.grad, upstream @ Q @ Q.T)


def test_orth_is_orthonormal_with_nonnegative_diag_r():
    S = torch.randn(32, 6, generator=GEN)
    Q = orth(S)
    torch.testing.assert_close(Q.T @ Q, torch.eye(6), atol=1e-5, rtol=0)
    R = Q.T @ S
    torch.testing.assert_close(R, torch.triu(R), atol=1e-5, rtol=0)
    assert (torch.diagonal(R) > 0).all()
    torch.testing.assert_close(orth(-3.0 * S), -orth(S), atol=1e-5, rtol=0)  # fixed convention, not QR's whim


def test_sketch_update_uses_real_tokens_only():
    Q = random_orthonormal(8, 3, seed=3)
    A = torch.randn(2, 4, 8, generator=GEN)
    mask = torch.tensor([[False, True, True, True], [True, True, False, False]])
    rows = A[mask]
    expected = rows.T @ (rows @ Q)
    torch.testing.assert_close(sketch_update(torch.zeros(8, 3), A, Q, mask), expected)
    torch.testing.assert_close(
        sketch_update(expected, A, Q, None), expected + A.reshape(-1, 8).T @ (A.reshape(-1, 8) @ Q)
    )


def principal_angle_sines(Q1: torch.Tensor, Q2: torch.Tensor) -> torch.Tensor:
    cosines = torch.linalg.svdvals(Q1.T @ Q2).clamp(max=1.0)
    return (1 - cosines**2).clamp_min(0).sqrt()


def test_refresh_recovers_a_planted_subspace_and_stays_orthonormal():
    """Activations = strong rank-4 signal + noise; a few refreshes (one power step each) find the signal."""
    d, r, tokens = 48, 4, 400
    planted = random_orthonormal(d, r, seed=11)
    A = torch.randn(tokens, r, generator=GEN) * torch.tensor([10.0, 8.0, 6.0, 5.0]) @ planted.T
    A = A + 0.3 * torch.randn(tokens, d, generator=GEN)
    codec = LowRankActivationCodec(hidden=d, rank=r, num_points=2, seed=0)
    start = principal_angle_sines(codec.bases[0], planted).max()
    for _ in range(4):
        codec.begin_sketch()
        codec.accumulate(0, A[:200], None)
        codec.accumulate(0, A[200:], None)  # summed over micro-batches
        refresh = codec.refresh()
    for Q in codec.bases:
        torch.testing.assert_close(Q.T @ Q, torch.eye(r), atol=1e-5, rtol=0)
    assert start > 0.5
    assert principal_angle_sines(codec.bases[0], planted).max() < 0.05
    assert refresh.mean_overlap > 0.5  # point 1 saw no token and kept its basis (overlap 1)
    assert refresh.overlap[1] == 1.0 and math.isnan(refresh.energy[1])
    assert refresh.energy[0] > 0.95 and refresh.mean_energy == refresh.energy[0]  # Q_old had found it
    torch.testing.assert_close(codec.bases[1], LowRankActivationCodec(d, r, 2, seed=0).bases[1])


def test_energy_captured_by_hand_and_one_at_full_rank():
    """||A Q||_F^2 / ||A||_F^2 over real tokens, with the basis the sketch used; 1 when r = d."""
    A = torch.randn(3, 5, 8, generator=GEN)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[0, :2] = False
    for rank in (3, 8):
        codec = LowRankActivationCodec(hidden=8, rank=rank, num_points=1, seed=4)
        Q = codec.bases[0].clone()
        codec.begin_sketch()
        codec.accumulate(0, A[:2], mask[:2])
        codec.accumulate(0, A[2:], mask[2:])
        rows = A[mask]
        expected = float((rows @ Q).square().sum() / rows.square().sum())
        energy = codec.refresh().energy[0]
        assert energy == pytest.approx(expected, rel=1e-5)
        if rank == 8:
            assert energy == pytest.approx(1.0, abs=1e-6)
        else:
            assert 0 < energy < 1
    S, terms = sketch_step(torch.zeros(8, 3), A, Q[:, :3], mask)
    torch.testing.assert_close(S, sketch_update(torch.zeros(8, 3), A, Q[:, :3], mask))
    assert terms.dtype == torch.float64
    assert energy_captured(float(terms[0]), float(terms[1])) == pytest.approx(
        float((A[mask] @ Q[:, :3]).square().sum() / A[mask].square().sum()), rel=1e-5
    )
    assert math.isnan(energy_captured(0.0, 0.0))


def test_initial_bases_are_seeded():
    a, b, c = (LowRankActivationCodec(32, 4, 3, seed=s) for s in (5, 5, 6))
    assert all(torch.equal(x, y) for x, y in zip(a.bases, b.bases, strict=True))
    assert not torch.equal(a.bases[0], c.bases[0]) and not torch.equal(a.bases[0], a.bases[1])


def splitmix64_reference(key: int, index: int) -> float:
    """The textbook splitmix64 stream in Python integers: the spec of prf_uniform, device-free."""
    mask = (1 << 64) - 1
    z = (key + (index + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return ((z ^ (z >> 31)) >> 11) / 2**53


def test_prf_uniform_is_the_splitmix64_stream():
    key = prf_key(0, 7, 3, 1)
    u = prf_uniform(key, (3, 5))
    expected = [splitmix64_reference(key & ((1 << 64) - 1), i) for i in range(15)]
    assert u.flatten().tolist() == expected
    assert torch.equal(prf_uniform((0, 7, 3, 1), (3, 5)), u)


def test_prf_mask_reproducible_redrawn_unbiased():
    p = 0.25
    A = torch.randn(64, 32, generator=GEN)
    codec = PRFMaskActivationCodec(keep=p, seed=0)
    first = codec.apply(A, point=1, tick=5, microbatch=2)
    assert torch.equal(first, codec.apply(A.clone(), point=1, tick=5, microbatch=2))  # same key, same mask
    assert torch.equal(first, prf_mask(A, p, codec.key(1, 5, 2)))
    others = [codec.apply(A, 1, 6, 2), codec.apply(A, 2, 5, 2), codec.apply(A, 1, 5, 3)]
    assert all(not torch.equal(first != 0, other != 0) for other in others)  # tick, layer, micro-batch
    assert (first != 0).float().mean().item() == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / A.numel()))
    ticks = 400
    mean = sum(codec.apply(A, 0, t, 0) for t in range(ticks)) / ticks
    # per element sd of the mean: |A| sqrt((1-p)/p/ticks) ~ 0.087 |A|; the grand error is far smaller
    assert ((mean - A).norm() / A.norm()).item() < 0.12
    assert abs(((mean - A).sum() / A.abs().sum()).item()) < 0.01
    kept = torch.stack([(codec.apply(A, 0, t, 0) != 0).float().mean() for t in range(50)])
    assert kept.mean().item() == pytest.approx(p, abs=0.01)


def test_prf_mask_of_bfloat16_activations_keeps_their_scale():
    """Pair A's keep rate 77/1536 in bfloat16 (verl's compute dtype): every kept element is its own
    ``a / p`` rounded once to bfloat16, so over many elements the scale is 1/p to rounding noise (a bfloat16
    ``1 / p`` constant, 20.0 for 19.948, scaled every kept element by 1.0026)."""
    p = 77 / 1536
    A = torch.randn(400, 1536, generator=GEN).to(torch.bfloat16)
    out = prf_mask(A, p, (0, 1, 2, 3))
    assert out.dtype == torch.bfloat16
    kept = out != 0
    exact = A[kept].double() / p
    assert torch.equal(out[kept], exact.to(torch.bfloat16))  # the exact a / p, rounded once
    assert (out[kept].double() / exact).mean().item() == pytest.approx(1.0, abs=2e-4)


def test_the_sketch_stays_float32_under_bfloat16_autocast():
    """verl runs the model's forward, and with it the codec's hooks, under ``torch.autocast(bfloat16)``:
    the anchor's sketch and energy terms are still float32 sums of the bfloat16 activations, equal to the
    same sums outside autocast (autocast would make ``S`` bfloat16 from the first micro-batch on)."""
    codec = LowRankActivationCodec(hidden=64, rank=4, num_points=1, seed=0)
    batches = [torch.randn(3, 10, 64, generator=GEN).mul(10).to(torch.bfloat16) for _ in range(4)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for A in batches:
            codec.accumulate(0, A, None)
    S, energy = codec.sketches[0], codec.energies[0]
    assert S.dtype == torch.float32
    Q, expected, kept, total = codec.bases[0], torch.zeros(64, 4), 0.0, 0.0
    for A in batches:
        rows = A.reshape(-1, 64).float()
        expected += rows.T @ (rows @ Q)
        kept, total = kept + (rows @ Q).square().sum().item(), total + rows.square().sum().item()
    torch.testing.assert_close(S, expected, rtol=1e-5, atol=1e-4)
    assert energy.tolist() == pytest.approx([kept, total], rel=1e-5)


def test_prf_mask_gradient_uses_the_same_mask():
    A = torch.randn(8, 16, generator=GEN, requires_grad=True)
    out = prf_mask(A, 0.5, (1, 2, 3))
    out.sum().backward()
    torch.testing.assert_close(A.grad, (out.detach() != 0).float() / 0.5)
