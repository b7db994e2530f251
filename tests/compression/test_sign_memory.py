"""Sign correction and dense memory against small hand-computed tensors (method.md §2, §3.5)."""

from __future__ import annotations

import torch

from commrl.compression import DenseMemory, sign_correct
from commrl.compression.sign_memory import sign_correct_


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
