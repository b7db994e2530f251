"""PowerSGD for the weight updates (method.md §2), with error feedback and a warm-started right factor.

Per 2-D gradient ``G`` (viewed as ``(shape[0], numel / shape[0])``, as PyTorch's hook views it):

    M = G + e;  P = orth(M Q);  Q = M^T P;  G_hat = P Q^T;  e = M - G_hat

``Q`` starts as a seeded Gaussian matrix and is orthogonalised before every use. Semantics follow
``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook`` with all gradients in one
bucket: a matrix is compressed only when ``(rows + cols) * rank * min_compression_rate < rows * cols``
(``_should_compress``; the rank is ``min(rows, cols, rank)``), others and 1-D parameters stay dense;
the first Q's are drawn after ``torch.manual_seed(np.random.RandomState(seed).randint(1e9))``, one
``randn(cols, rank)`` per matrix in the hook's order (grouped by shape, in order of first appearance).
The hook's ``start_powerSGD_iter`` warm-up (vanilla all-reduce) has no counterpart here: the
controller's anchor fire at t = 0 is the dense start, and every call of ``compress_`` compresses.

Row-sharded gradients (an FSDP2 ``DTensor`` with placement ``Shard(0)``, or ``shard_groups``) hold a slice
of the rows of the full matrix. ``P`` is then row-sharded too: it is orthogonalised with Cholesky-QR
(``P^T P`` all-reduced, ``P <- P L^-T``, done twice for float accuracy) and ``Q = M^T P`` is all-reduced
(a sum over row blocks), so every rank gets its rows of the unsharded result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard

from commrl.compression.activation import orth
from commrl.compression.ledger import matrix_view, should_compress


@dataclass(frozen=True)
class WireBytes:
    """Bytes sent and the bytes the dense update would have sent."""

    actual: float
    dense: float


def local_tensor(t: Tensor) -> Tensor:
    """The local shard of a ``DTensor`` (a view: in-place edits reach the DTensor), else ``t``."""
    return t.to_local() if isinstance(t, DTensor) else t


def shard_group(t: Tensor, process_group: dist.ProcessGroup | None = None) -> dist.ProcessGroup | None:
    """The group across which ``t``'s rows are split: None for plain or replicated tensors.

    A ``DTensor`` must be ``Shard(0)`` (FSDP2's layout) on a 1-D mesh, or replicated; ``process_group``
    overrides the mesh's group.
    """
    if not isinstance(t, DTensor):
        return None
    placements = tuple(t.placements)
    if all(isinstance(pl, Replicate) for pl in placements):
        return None
    if len(placements) != 1 or placements[0] != Shard(0):
        raise ValueError(
            f"gradient placement {placements} is not supported: PowerSGD handles row-sharded "
            "(Shard(0), FSDP2) "
            "or replicated DTensors on a 1-D mesh"
        )
    return process_group if process_group is not None else t.device_mesh.get_group()


def cholesky_orth(ps: list[Tensor], group: dist.ProcessGroup | None = None, passes: int = 2) -> list[Tensor]:
    """Orthonormal columns of row-sharded P's: ``G = sum_ranks P^T P``, ``L = chol(G)``, ``P <- P L^-T``.

    Two passes (CholeskyQR2) give the accuracy of Householder QR, with ``diag(R) > 0`` as in ``orth``. The
    Gram matrices of all P's travel in one all-reduce per pass, in float64; a singular one (a zero
    gradient) gets a tiny diagonal shift.
    """
    for _ in range(passes):
        grams = [P.T.double() @ P.double() for P in ps]
        if group is not None:
            all_reduce_many(grams, group)
        ps = [
            torch.linalg.solve_triangular(_cholesky(gram), P.T.double(), upper=False).T.to(P.dtype)
            for P, gram in zip(ps, grams, strict=True)
        ]
    return ps


def _one_group(groups: list[dist.ProcessGroup]) -> dist.ProcessGroup | None:
    if any(g is not groups[0] for g in groups):
        raise ValueError("row-sharded gradients span several process groups; pass process_group explicitly")
    return groups[0] if groups else None


def _cholesky(gram: Tensor) -> Tensor:
    L, info = torch.linalg.cholesky_ex(gram)
    if int(info) == 0:
        return L
    shift = 1e-30 + 1e-12 * float(torch.diagonal(gram).abs().max())
    return torch.linalg.cholesky(
        gram + shift * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    )


def all_reduce_many(tensors: list[Tensor], group: dist.ProcessGroup) -> None:
    """Sum a list of tensors across ``group`` in one collective (flatten, all-reduce, copy back)."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


class PowerSGD:
    """PowerSGD state for a set of named gradients: error buffers, warm-start Q's, the seed generator."""

    def __init__(self, rank: int, min_compression_rate: float = 2.0, seed: int = 0) -> None:
        self.rank = rank
        self.min_compression_rate = min_compression_rate
        self.rng = np.random.RandomState(seed)
        self.error: dict[str, Tensor] = {}
        self.q: dict[str, Tensor] = {}

    def effective_rank(self, full_shape: torch.Size | tuple[int, ...]) -> int:
        rows, cols = matrix_view(full_shape)
        return min(rows, cols, self.rank)

    def compresses(self, full_shape: torch.Size | tuple[int, ...]) -> bool:
        """True when a gradient of this (full) shape goes through PowerSGD; 1-D ones never do."""
        if len(full_shape) < 2:
            return False
        rows, cols = matrix_view(full_shape)
        return should_compress(rows, cols, self.effective_rank(full_shape), self.min_compression_rate)

    @torch.no_grad()
    def compress_(
        self,
        grads: Mapping[str, Tensor],
        process_group: dist.ProcessGroup | None = None,
    ) -> WireBytes:
        """Replace every compressible gradient by ``G_hat`` in place; return the wire bytes.

        ``grads`` may hold ``DTensor``s: their local shards are edited, and row-sharded ones reduce their
        factors over ``process_group`` (default: their mesh's group).
        """
        items = []  # (name, local 2-D view, full shape, group)
        actual = dense = 0.0
        for name, grad in grads.items():
            local = local_tensor(grad)
            group = shard_group(grad, process_group)
            full_shape = tuple(grad.shape)
            numel, esize = math.prod(full_shape), local.element_size()
            dense += numel * esize
            if not self.compresses(full_shape):
                actual += numel * esize
                continue
            rows, cols = matrix_view(full_shape)
            actual += (rows + cols) * self.effective_rank(full_shape) * esize
            if not local.is_contiguous():
                raise ValueError(f"gradient {name!r} is not contiguous; PowerSGD edits it in place")
            items.append((name, local.view(local.shape[0], cols), full_shape, group))
        self._init_q(items)
        self._compress_items(items)
        return WireBytes(actual=actual, dense=dense)

    def _init_q(self, items: list) -> None:
        """First Q's, drawn as PyTorch's hook draws them for one bucket (grouped by shape)."""
        fresh = [(name, full_shape, m) for name, m, full_shape, _ in items if name not in self.q]
        if not fresh:
            return
        by_shape: dict[tuple[int, int], list] = {}
        for name, full_shape, m in fresh:
            by_shape.setdefault(matrix_view(full_shape), []).append((name, full_shape, m))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.rng.randint(1_000_000_000))
            for group in by_shape.values():
                for name, full_shape, m in group:
                    _, cols = matrix_view(full_shape)
                    q = torch.randn(cols, self.effective_rank(full_shape), device="cpu", dtype=m.dtype)
                    self.q[name] = q.to(m.device)

    def _compress_items(self, items: list) -> None:
        ps = {}
        for name, m, _, _ in items:
            e = self.error.get(name)
            if e is None:
                e = self.error[name] = torch.zeros_like(m)
            e.add_(m)  # e now holds M = G + e
            ps[name] = e @ orth(self.q[name])
        sharded = [name for name, _, _, group in items if group is not None]
        for name, _, _, group in items:
            if group is None:
                ps[name] = orth(ps[name])
        group = _one_group([g for _, _, _, g in items if g is not None])
        if sharded:
            ps.update(zip(sharded, cholesky_orth([ps[name] for name in sharded], group), strict=True))
        qs = {name: self.error[name].T @ ps[name] for name, _, _, _ in items}
        if sharded:
            all_reduce_many([qs[name] for name in sharded], group)
        for name, m, _, _ in items:
            torch.mm(ps[name], qs[name].T, out=m)  # G_hat, in place of the gradient
            self.error[name].sub_(m)  # e = M - G_hat
            self.q[name] = qs[name]

    def state_dict(self) -> dict:
        kind, keys, pos, has_gauss, cached = self.rng.get_state()
        return {
            "error": {k: v.detach().cpu().clone() for k, v in self.error.items()},
            "q": {k: v.detach().cpu().clone() for k, v in self.q.items()},
            "rng": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        }

    def load_state_dict(self, state: dict) -> None:
        self.error = {k: v.clone() for k, v in state["error"].items()}
        self.q = {k: v.clone() for k, v in state["q"].items()}
        kind, keys, pos, has_gauss, cached = state["rng"]
        self.rng.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
