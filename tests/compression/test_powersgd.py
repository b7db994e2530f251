"""PowerSGD: equal to PyTorch's own hook, error feedback, Cholesky-QR (the sharded run: test_distributed)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from commrl.compression.powersgd import PowerSGD, cholesky_orth

SHAPES = [(41, 30), (20,), (30, 40), (41, 30), (8, 6), (12, 5, 6)]  # 41 rows: uneven row shards


class HandBucket:
    """A gradient bucket built by hand for ``powerSGD_hook``: DDP's C++ ``GradBucket`` has no Python
    constructor, and the hook only calls ``buffer``, ``gradients``, ``index`` and ``is_last``."""

    def __init__(self, grads: list[torch.Tensor]) -> None:
        self._buffer = torch.cat([g.reshape(-1) for g in grads])
        self._views, offset = [], 0
        for g in grads:
            self._views.append(self._buffer[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._views

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True


def random_grads(step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return [torch.randn(*shape, generator=gen) for shape in SHAPES]


@pytest.fixture
def gloo_world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("rank", [1, 4])
def test_equals_pytorch_powersgd_hook(gloo_world_of_one, rank):
    """Four compressed steps (warm start, error feedback, the dense rule) agree with the real hook to 1e-5."""
    state = PowerSGDState(
        process_group=gloo_world_of_one,
        matrix_approximation_rank=rank,
        start_powerSGD_iter=2,
        min_compression_rate=2,
        random_seed=0,
    )
    for warmup in range(2):  # the hook's vanilla all-reduce iterations; ours has none (the anchor's t = 0)
        powerSGD_hook(state, HandBucket(random_grads(100 + warmup))).wait()
    ours = PowerSGD(rank=rank, min_compression_rate=2.0, seed=0)
    for step in range(4):
        grads = random_grads(step)
        bucket = HandBucket([g.clone() for g in grads])
        powerSGD_hook(state, bucket).wait()
        named = {f"p{i}": g for i, g in enumerate(grads)}
        wire = ours.compress_(named)
        for theirs, mine in zip(bucket.gradients(), grads, strict=True):
            torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
        assert wire.dense == sum(g.numel() for g in grads) * 4
    compressed = [i for i, s in enumerate(SHAPES) if ours.compresses(s)]
    assert compressed == ([0, 2, 3, 4, 5] if rank == 1 else [0, 2, 3, 5])  # 1-D always dense, 8 x 6 at rank 4
    flat_error = torch.cat(
        [ours.error.get(f"p{i}", torch.zeros(SHAPES[i])).reshape(-1) for i in range(len(SHAPES))]
    )
    torch.testing.assert_close(flat_error, state.error_dict[0], atol=1e-5, rtol=1e-5)


def test_error_feedback_tracks_the_true_sum():
    """With error feedback the running sum of G_hat tracks the sum of G (it misses only the last residual);
    without it the rank-2 compression of a rank-4 signal loses half of it for good."""
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(64, 4, generator=gen) @ torch.randn(4, 48, generator=gen) / 2
    with_ef, without_ef = PowerSGD(rank=2, seed=1), PowerSGD(rank=2, seed=1)
    sum_true, sum_ef, sum_plain = torch.zeros(64, 48), torch.zeros(64, 48), torch.zeros(64, 48)
    for _ in range(100):
        G = base + 0.3 * torch.randn(64, 48, generator=gen)
        sum_true += G
        g1, g2 = G.clone(), G.clone()
        with_ef.compress_({"w": g1})
        without_ef.compress_({"w": g2})
        without_ef.error.clear()  # no memory of the residual
        sum_ef += g1
        sum_plain += g2
    # the identity sum(G_hat) = sum(G) - e_final holds exactly with error feedback
    torch.testing.assert_close(sum_ef, sum_true - with_ef.error["w"], atol=1e-3, rtol=1e-4)
    gap_ef = (sum_ef - sum_true).norm() / sum_true.norm()
    gap_plain = (sum_plain - sum_true).norm() / sum_true.norm()
    assert gap_ef < 0.05
    assert gap_plain > 0.3


def test_cholesky_orth_equals_householder_on_one_rank():
    P = torch.randn(50, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (Q_chol,) = cholesky_orth([P])
    Q_house, R = torch.linalg.qr(P)
    Q_house = Q_house * torch.sign(torch.diagonal(R))
    torch.testing.assert_close(Q_chol, Q_house, atol=1e-10, rtol=0)
