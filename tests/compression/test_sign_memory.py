"""Sign correction and dense memory against small hand-computed tensors (method.md §2, §3.5)."""

from __future__ import annotations

import torch

from commrl.compression import DenseMemory, sign_correct
from commrl.compression.sign_memory import sign_agreement, sign_correct_


def test_sign_correct_by_hand():
    G = torch.tensor([2.0, -4.0, 1.0, -1.0, 3.0])
    M = torch.tensor([1.0, 1.0, -5.0, -0.1, 0.0])
    # alpha * G + (1 - alpha) * |G| * sign(M), alpha = 0.25
    expected = torch.tensor([0.5 + 1.5, -1.0 + 3.0, 0.25 - 0.75, -0.25 - 0.75, 0.75 + 0.0])
    torch.testing.assert_close(sign_correct(G, M, 0.25), expected)
    in_place = G.clone()
    assert sign_correct_(in_place, M, 0.25) is in_place
    torch.testing.assert_close(in_place, expected)
    torch.testing.assert_close(sign_correct(G, M, 1.0), G)  # alpha = 1: no correction
    with_sign = G.clone()  # the caller's sign(M), shared with sign_agreement: the same bits
    assert torch.equal(sign_correct_(with_sign, M, 0.25, torch.sign(M)), in_place)


def test_sign_agreement_counts_the_sign_products_definition():
    """``(agree, total)`` = ``#{sign(G) sign(M) > 0}``, ``#{sign(G) sign(M) != 0}``, also on zeros of both
    signs, NaN (``torch.sign`` gives 0), infinities and values whose float product would underflow."""
    gen = torch.Generator().manual_seed(0)
    G, M = torch.randn(10_000, generator=gen), torch.randn(10_000, generator=gen)
    G[::7], M[::11], G[1::13], M[2::17] = 0.0, 0.0, -0.0, -0.0
    G[3::19], M[3::19] = 1e-30, -1e-30
    G[5::23], M[6::29] = float("nan"), float("nan")
    G[8::31], G[9::37], M[9::37] = float("inf"), float("-inf"), 0.0
    product = torch.sign(G) * torch.sign(M)
    expected = torch.tensor([(product > 0).sum(), (product != 0).sum()], dtype=torch.float64)
    counts = sign_agreement(G, torch.sign(M))
    assert counts.dtype == torch.float64 and torch.equal(counts, expected)
    hand = sign_agreement(
        torch.tensor([2.0, -1.0, 0.0, 3.0, -1e-30]), torch.tensor([1.0, 1.0, -1.0, 0.0, -1.0])
    )
    assert hand.tolist() == [2.0, 3.0]  # agree: 2 and -1e-30; total: those and -1 against 1


def test_dense_memory_first_fire_then_blend():
    memory = DenseMemory(beta=0.25)
    assert not memory and "w" not in memory
    g1 = torch.tensor([[4.0, -8.0]])
    memory.update({"w": g1})
    assert memory and torch.equal(memory["w"], g1)
    g1.zero_()  # the memory holds a copy, not the driver's gradient buffer
    assert torch.equal(memory["w"], torch.tensor([[4.0, -8.0]]))
    memory.update({"w": torch.tensor([[0.0, 4.0]])})
    # 0.25 * [4, -8] + 0.75 * [0, 4] = [1, 1]
    torch.testing.assert_close(memory["w"], torch.tensor([[1.0, 1.0]]))
    restored = DenseMemory(beta=0.25)
    restored.load_state_dict(memory.state_dict())
    assert torch.equal(restored["w"], memory["w"])
