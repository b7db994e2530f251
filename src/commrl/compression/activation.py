"""Activation codecs of the fast circuit (method.md §2) and the basis refresh of the anchor (§3.4).

Pure functions carry the math; the three codec classes hold the state a codec needs (the low-rank bases
and their sketches). Every codec is a linear map of the activations, so the backward activation gradient
goes through the same map: for ``lowrank`` the gradient of ``(A Q) Q^T`` with respect to ``A`` is
``(G Q) Q^T``, for ``prf_mask`` it is ``(m * G) / p`` with the same mask.

The PRF is splitmix64 (Steele, Lea, Flood 2014) on int64 tensors: the i-th output of the stream keyed by
``k`` is ``mix(k + (i + 1) * golden)``. Integer wrap-around arithmetic is identical on every device, so a
mask depends only on its key and the tensor shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_TWO_POW_53 = float(1 << 53)
BASIS_KEY_TAG = 0xB5
MASK_KEY_TAG = 0x3A


def _as_int64(value: int) -> int:
    """An unsigned 64-bit constant as the signed int64 with the same bits."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(x: Tensor, bits: int) -> Tensor:
    """Logical (zero-filling) right shift of int64 tensors; ``>>`` on int64 is arithmetic."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(x: Tensor) -> Tensor:
    """splitmix64's output function on int64 tensors (wrap-around arithmetic, ``>>>`` logical):

    ``z ^= z >>> 30; z *= c1; z ^= z >>> 27; z *= c2; z ^= z >>> 31``.
    """
    z = (x ^ _shift_right(x, 30)) * _as_int64(_MIX1)
    z = (z ^ _shift_right(z, 27)) * _as_int64(_MIX2)
    return z ^ _shift_right(z, 31)


def prf_key(*parts: int) -> int:
    """Fold non-negative integers (seed, tick, layer, micro-batch, ...) into one 64-bit key (as int64)."""
    z = torch.zeros((), dtype=torch.int64)
    for part in parts:
        if not 0 <= int(part) < 1 << 63:
            raise ValueError(f"PRF key part {part!r} must be an integer in [0, 2**63)")
        z = splitmix64(z + _as_int64(_GOLDEN) ^ int(part))
    return int(z)


def prf_uniform(
    key: int | Sequence[int], shape: Sequence[int], device: torch.device | str | None = None
) -> Tensor:
    """Counter-based uniforms in [0, 1): ``u_i = (splitmix64(k + (i + 1) * golden) >>> 11) / 2^53`` (float64).

    ``key`` is a folded key or the parts to fold (method.md §2: seed, tick, layer, micro-batch); ``i`` is
    the row-major element index. The result depends on nothing but the key and the shape.
    """
    k = prf_key(*key) if isinstance(key, Sequence) else int(key)
    numel = 1
    for size in shape:
        numel *= int(size)
    counter = torch.arange(1, numel + 1, dtype=torch.int64, device=device)
    bits = splitmix64(counter * _as_int64(_GOLDEN) + k)
    return (_shift_right(bits, 11).to(torch.float64) / _TWO_POW_53).reshape(tuple(shape))


def prf_mask(A: Tensor, p: float, key: int | Sequence[int]) -> Tensor:
    """``A_hat = (m * A) / p``, ``m_i = [u_i < p]`` from ``prf_uniform(key)`` (method.md §2).

    Unbiased: ``E[A_hat] = A``. The scale ``m / p`` and the product are float32 for a half-precision
    ``A``, rounded per element at the end: ``1 / p`` rounded to bfloat16 would scale every kept element by
    one biased constant (``p = 77/1536``: 19.948 becomes 20.0, ``E[A_hat] = 1.0026 A``).
    """
    keep = prf_uniform(key, A.shape, device=A.device) < p
    wide = torch.promote_types(A.dtype, torch.float32)
    return (A.to(wide) * (keep.to(wide) / p)).to(A.dtype)


def lowrank_project(A: Tensor, Q: Tensor) -> Tensor:
    """``A_hat = (A Q) Q^T`` (method.md §2), ``Q`` d x r, orthonormal columns; rows of ``A`` are tokens."""
    return (A @ Q) @ Q.T


def sketch_update(S: Tensor, A: Tensor, Q: Tensor, token_mask: Tensor | None = None) -> Tensor:
    """``S + A^T (A Q)`` over the non-padding rows of ``A`` (method.md §3.4), computed in ``S``'s dtype.

    ``A`` is (..., d); ``token_mask`` (its leading shape, True = real token) selects the rows; None keeps all.
    """
    return sketch_step(S, A, Q, token_mask)[0]


def sketch_step(S: Tensor, A: Tensor, Q: Tensor, token_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``sketch_update`` and, from the same ``A Q``, the energy terms ``(||A Q||_F^2, ||A||_F^2)``.

    Both over the non-padding rows of ``A``, computed in ``S``'s dtype; the energy terms come back as a
    float64 pair (their ratio is ``energy_captured``). Autocast is off here: the hooks run inside the
    model's forward, which verl runs under ``torch.autocast(bfloat16)``, and autocast would compute both
    products in bfloat16 and hand back a bfloat16 ``S`` (every later micro-batch's sum and the ranks'
    all-reduce then rounded to 8 mantissa bits).
    """
    rows = A.detach()
    rows = rows[token_mask] if token_mask is not None else rows.reshape(-1, rows.shape[-1])
    with torch.autocast(rows.device.type, enabled=False):
        rows = rows.to(S.dtype)
        projected = rows @ Q.to(S.dtype)
        energy = torch.stack([projected.square().sum(), rows.square().sum()]).double()
        return torch.addmm(S, rows.T, projected), energy


def energy_captured(kept: float, total: float) -> float:
    """``||A Q||_F^2 / ||A||_F^2``: the share of the activations' energy that the basis ``Q`` keeps (§4).

    With orthonormal columns ``||A Q||_F = ||(A Q) Q^T||_F``, so this is
    ``1 - ||A - A_hat||_F^2 / ||A||_F^2``; 1 for ``r = d``, about ``r / d`` for a random basis and isotropic
    activations. NaN when ``A`` is zero.
    """
    return kept / total if total > 0 else math.nan


def orth(S: Tensor) -> Tensor:
    """Orthonormal columns spanning ``S`` (d x r): reduced QR with ``diag(R) >= 0`` (method.md §3.4).

    The sign convention makes the result unique for full-rank ``S``; half precision is computed in float32.
    """
    work = S.float() if S.dtype in (torch.float16, torch.bfloat16) else S
    Q, R = torch.linalg.qr(work)
    signs = torch.sign(torch.diagonal(R))
    signs = torch.where(signs == 0, torch.ones_like(signs), signs)
    return (Q * signs).to(S.dtype)


def random_orthonormal(d: int, r: int, seed: int) -> Tensor:
    """A seeded random d x r float32 matrix with orthonormal columns (the basis before any fire, §3.4)."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    return orth(torch.randn(d, r, generator=gen, dtype=torch.float32))


def subspace_overlap(Q_old: Tensor, Q_new: Tensor) -> float:
    """``||Q_old^T Q_new||_F^2 / r``: 1 when the spans agree, about r/d for unrelated random spans."""
    return float((Q_old.T.float() @ Q_new.float()).square().sum() / Q_old.shape[1])


class IdentityCodec:
    """The dense baseline: activations travel as they are (``tokens * d`` each way)."""

    name = "identity"

    def apply(self, A: Tensor, point: int, tick: int, microbatch: int) -> Tensor:
        return A

    def wire_elements(self, tokens: int, hidden: int) -> float:
        return float(tokens * hidden)


@dataclass(frozen=True)
class BasisRefresh:
    """What a refresh ``Q <- orth(S)`` measured, per compression point.

    ``overlap[i]``: ``subspace_overlap(Q_old, Q_new)`` (1.0 where the point saw no token and kept its basis);
    ``energy[i]``: ``energy_captured`` of the sketched activations by the basis they were sketched with,
    ``Q_old`` (NaN where the point saw no token).
    """

    overlap: list[float]
    energy: list[float]

    @property
    def mean_overlap(self) -> float:
        return sum(self.overlap) / len(self.overlap)

    @property
    def mean_energy(self) -> float:
        """Mean of ``energy`` over the points that saw tokens (NaN when none did)."""
        seen = [e for e in self.energy if not math.isnan(e)]
        return sum(seen) / len(seen) if seen else math.nan


class LowRankActivationCodec:
    """``A_hat = (A Q) Q^T`` with one basis per compression point (method.md §2) and its refresh (§3.4).

    Before the first refresh ``Q`` is ``random_orthonormal`` seeded by (seed, point). ``accumulate`` adds
    ``A^T (A Q)`` to the point's sketch during a dense pass (and ``(||A Q||_F^2, ||A||_F^2)`` to its energy
    terms); ``refresh`` sets ``Q <- orth(S)`` everywhere. Bases are kept in float32 and cast to the
    activations' device and dtype when used.
    """

    name = "lowrank"

    def __init__(self, hidden: int, rank: int, num_points: int, seed: int) -> None:
        self.hidden, self.rank = hidden, rank
        self.bases = [
            random_orthonormal(hidden, rank, prf_key(seed, BASIS_KEY_TAG, point))
            for point in range(num_points)
        ]
        self.sketches: list[Tensor | None] = [None] * num_points
        self.energies: list[Tensor | None] = [None] * num_points
        self._cast: dict[tuple[int, torch.device, torch.dtype], Tensor] = {}

    def basis(self, point: int, like: Tensor) -> Tensor:
        key = (point, like.device, like.dtype)
        if key not in self._cast:
            self._cast[key] = self.bases[point].to(device=like.device, dtype=like.dtype)
        return self._cast[key]

    def apply(self, A: Tensor, point: int, tick: int, microbatch: int) -> Tensor:
        return lowrank_project(A, self.basis(point, A))

    def wire_elements(self, tokens: int, hidden: int) -> float:
        return float(tokens * self.rank)

    def begin_sketch(self) -> None:
        self.sketches = [None] * len(self.bases)
        self.energies = [None] * len(self.bases)

    def accumulate(self, point: int, A: Tensor, token_mask: Tensor | None) -> None:
        S = self.sketches[point]
        if S is None:
            S = torch.zeros(self.hidden, self.rank, dtype=torch.float32, device=A.device)
        S, energy = sketch_step(S, A, self.bases[point].to(A.device), token_mask)
        previous = self.energies[point]
        self.sketches[point] = S
        self.energies[point] = energy if previous is None else previous + energy

    def refresh(self, all_reduce: Callable[[Tensor], None] | None = None) -> BasisRefresh:
        """``Q <- orth(S)`` at every point (sketches and energy terms summed over ranks by ``all_reduce``).

        A point whose summed sketch is zero (it saw no token) keeps its basis.
        """
        device = next((S.device for S in self.sketches if S is not None), self.bases[0].device)
        stacked = torch.stack(
            [
                S if S is not None else torch.zeros(self.hidden, self.rank, device=device)
                for S in self.sketches
            ]
        )
        energies = torch.stack(
            [
                e.to(device) if e is not None else torch.zeros(2, dtype=torch.float64, device=device)
                for e in self.energies
            ]
        )
        if all_reduce is not None:
            all_reduce(stacked)
            all_reduce(energies)
        overlaps = []
        for point, S in enumerate(stacked):
            old = self.bases[point]
            if torch.count_nonzero(S) == 0:
                overlaps.append(1.0)
                continue
            self.bases[point] = orth(S).to(device=old.device, dtype=torch.float32)
            overlaps.append(subspace_overlap(old, self.bases[point]))
        self.sketches = [None] * len(self.bases)
        self.energies = [None] * len(self.bases)
        self._cast.clear()
        return BasisRefresh(overlaps, [energy_captured(kept, total) for kept, total in energies.tolist()])

    def state_dict(self) -> dict:
        return {"bases": [Q.detach().cpu().clone() for Q in self.bases]}

    def load_state_dict(self, state: dict) -> None:
        bases = state["bases"]
        if len(bases) != len(self.bases) or any(Q.shape != (self.hidden, self.rank) for Q in bases):
            raise ValueError(
                f"saved low-rank bases ({len(bases)} x {tuple(bases[0].shape) if bases else ()}) do not fit "
                "this "
                f"model ({len(self.bases)} x {(self.hidden, self.rank)}); resume with the same model and rank"
            )
        self.bases = [
            Q.to(device=old.device, dtype=torch.float32) for Q, old in zip(bases, self.bases, strict=True)
        ]
        self._cast.clear()


class PRFMaskActivationCodec:
    """``A_hat = (m * A) / p``, mask keyed by (seed, tick, layer, micro-batch), redrawn every tick (§2).

    Sends the kept values only: ``p * tokens * d`` elements each way (the receiver derives the mask).
    """

    name = "prf_mask"

    def __init__(self, keep: float, seed: int) -> None:
        self.keep, self.seed = keep, seed

    def key(self, point: int, tick: int, microbatch: int) -> int:
        return prf_key(self.seed, MASK_KEY_TAG, tick, point, microbatch)

    def apply(self, A: Tensor, point: int, tick: int, microbatch: int) -> Tensor:
        return prf_mask(A, self.keep, self.key(point, tick, microbatch))

    def wire_elements(self, tokens: int, hidden: int) -> float:
        return self.keep * tokens * hidden


ActivationCodec = IdentityCodec | LowRankActivationCodec | PRFMaskActivationCodec
