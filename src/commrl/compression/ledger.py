"""What would cross the network: a per-tick byte ledger and the analytic formula it must agree with.

Layout (method.md §2, §4): one compression point on the output of every decoder layer (``points: all``)
or of every layer but the last (``points: boundaries``), each a tensor that would cross a pipeline boundary,
and the weight updates of every parameter. A layer output without a point is not a communicated tensor:
neither the method nor the dense run sends it, so it adds nothing to either side. Per tick and channel the
ledger keeps the bytes the method sends and the bytes a dense run would have sent for the same work:

- ``activations_forward`` / ``activations_backward``: ``tokens * r`` (lowrank), ``p * tokens * d``
  (prf_mask) or ``tokens * d`` (dense passes, the anchor's replay) elements per point and pass, at the
  activations' element size; dense equivalent ``tokens * d``.
- ``basis_refresh``: ``d * r`` per point when the bases change; a dense run sends nothing for it.
- ``weights``: ``(m + n) * rank`` per PowerSGD-compressed m x n gradient, ``numel`` for the rest and for
  the anchor's dense update, at the gradient's element size; dense equivalent ``numel``.

Bytes recorded while ``anchor()`` is active are also summed as ``comm/bytes_anchor``. Shapes are the full
(unsharded) shapes, so every rank of a sharded run keeps the same model-level ledger.

``python -m commrl.compression`` prints the analytic ratio to dense for pair A (Qwen2.5-1.5B).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from commrl.compression.config import compression_layers

CHANNELS = ("activations_forward", "activations_backward", "basis_refresh", "weights")
ACTIVATION_CHANNELS = ("activations_forward", "activations_backward", "basis_refresh")


class ByteLedger:
    """Bytes per tick per channel, the dense equivalent, and cumulative totals."""

    def __init__(self) -> None:
        self.tick_bytes = dict.fromkeys(CHANNELS, 0.0)
        self.tick_dense = 0.0
        self.tick_anchor = 0.0
        self.cumulative = 0.0
        self.cumulative_dense = 0.0
        self._in_anchor = False

    def add(self, channel: str, actual: float, dense: float) -> None:
        if channel not in self.tick_bytes:
            raise ValueError(f"unknown ledger channel {channel!r}; one of {', '.join(CHANNELS)}")
        self.tick_bytes[channel] += actual
        self.tick_dense += dense
        if self._in_anchor:
            self.tick_anchor += actual

    @contextmanager
    def anchor(self) -> Iterator[None]:
        """Everything recorded inside also counts as the anchor circuit's bytes."""
        self._in_anchor = True
        try:
            yield
        finally:
            self._in_anchor = False

    def end_tick(self) -> dict[str, float]:
        """The tick's ``comm/*`` metrics (method.md §4); resets the per-tick counters."""
        activations = sum(self.tick_bytes[ch] for ch in ACTIVATION_CHANNELS)
        weights = self.tick_bytes["weights"]
        total = activations + weights
        self.cumulative += total
        self.cumulative_dense += self.tick_dense
        metrics = {
            "comm/bytes_activations": activations,
            "comm/bytes_weights": weights,
            "comm/bytes_basis_refresh": self.tick_bytes["basis_refresh"],
            "comm/bytes_anchor": self.tick_anchor,
            "comm/bytes_total": total,
            "comm/bytes_dense": self.tick_dense,
            "comm/bytes_cumulative": self.cumulative,
            "comm/ratio_vs_dense": self.cumulative / self.cumulative_dense if self.cumulative_dense else 1.0,
        }
        self.tick_bytes = dict.fromkeys(CHANNELS, 0.0)
        self.tick_dense = self.tick_anchor = 0.0
        return metrics

    def state_dict(self) -> dict[str, float]:
        return {"cumulative": self.cumulative, "cumulative_dense": self.cumulative_dense}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.cumulative = float(state["cumulative"])
        self.cumulative_dense = float(state["cumulative_dense"])


def should_compress(rows: int, cols: int, rank: int, min_compression_rate: float) -> bool:
    """PyTorch's ``_should_compress``: ``(rows + cols) * rank * min_compression_rate < rows * cols``."""
    return (rows + cols) * rank * min_compression_rate < rows * cols


def matrix_view(shape: Sequence[int]) -> tuple[int, int]:
    """The 2-D view PowerSGD compresses: ``(shape[0], numel / shape[0])`` (as PyTorch's hook views it)."""
    rows = int(shape[0])
    return rows, math.prod(int(s) for s in shape) // max(rows, 1)


def weight_update_elements(
    shape: Sequence[int], grad_rank: int, min_compression_rate: float
) -> tuple[int, int]:
    """(elements sent, dense elements) for one parameter's update (method.md §2; 1-D params travel dense)."""
    numel = math.prod(int(s) for s in shape)
    if len(shape) < 2:
        return numel, numel
    rows, cols = matrix_view(shape)
    rank = min(rows, cols, grad_rank)
    if should_compress(rows, cols, rank, min_compression_rate):
        return (rows + cols) * rank, numel
    return numel, numel


@dataclass(frozen=True)
class AnalyticBytes:
    """Analytic bytes of a fast tick, an anchor fire tick and a dense run's tick, and the ratio per cycle."""

    fast_activations: float
    fast_weights: float
    fire_activations: float
    fire_basis: float
    fire_weights: float
    dense_activations: float
    dense_weights: float
    cadence: int
    anchor: bool

    @property
    def fast_tick(self) -> float:
        return self.fast_activations + self.fast_weights

    @property
    def fire_tick(self) -> float:
        return self.fire_activations + self.fire_basis + self.fire_weights

    @property
    def dense_tick(self) -> float:
        return self.dense_activations + self.dense_weights

    @property
    def ratio_vs_dense(self) -> float:
        """Over one anchor cycle: ``(fire + (K - 1) * fast) / (fire_dense + (K - 1) * dense)``.

        A fire's dense equivalent is the fire without its basis refresh (the replay and its update are
        dense). Without the anchor: ``fast / dense``.
        """
        if not self.anchor:
            return self.fast_tick / self.dense_tick
        k = self.cadence
        fire_dense = self.fire_activations + self.fire_weights
        return (self.fire_tick + (k - 1) * self.fast_tick) / (fire_dense + (k - 1) * self.dense_tick)


def analytic_tick_bytes(
    hidden: int,
    layers: int,
    weight_shapes: Sequence[Sequence[int]],
    tokens_per_tick: int,
    rank: int,
    grad_rank: int | None = None,
    cadence: int = 20,
    act_bytes: int = 2,
    grad_bytes: int = 4,
    min_compression_rate: float = 2.0,
    updates_per_tick: int = 1,
    fire_updates: int = 1,
    codec: str = "lowrank",
    prf_keep: float | None = None,
    grad_codec: str = "powersgd",
    anchor: bool = True,
    points: str = "all",
) -> AnalyticBytes:
    """Analytic wire bytes for a model shape (method.md §2-§3), counting the training passes only.

    ``points`` (``all``: ``layers`` compression points; ``boundaries``: ``layers - 1``, the last layer's
    output crosses no boundary) sets the number of points ``P`` below.
    A fast tick: every token goes forward and backward through ``P`` compression points, ``r`` (lowrank),
    ``p * d`` (prf_mask) or ``d`` (identity) elements per token each way, and ``updates_per_tick`` weight
    updates (PowerSGD ``(m + n) * rank`` per compressible matrix, dense otherwise). A fire tick: the dense
    replay (``d`` per token each way), ``fire_updates`` dense weight updates and the basis refresh
    ``P * d * r`` (lowrank only): one update for the local driver (``commrl.rl.trainer``: the replay of the
    whole batch, one optimizer step), ``updates_per_tick`` for verl's engine (``commrl.verl_ext.engine``:
    the replay of the first mini-batch, the later mini-batches updated dense). ``act_bytes`` /
    ``grad_bytes`` are the element sizes (bf16 activations, fp32 reduced gradients by default). Extra
    forward-only passes (old/ref log-probs) are not counted here.
    """
    grad_rank = rank if grad_rank is None else grad_rank
    n_points = len(compression_layers(layers, points))
    per_token = {"lowrank": rank, "identity": hidden, "prf_mask": (prf_keep or rank / hidden) * hidden}
    if codec not in per_token:
        raise ValueError(f"codec={codec!r} is not one of {', '.join(per_token)}")
    dense_act = 2.0 * n_points * tokens_per_tick * hidden * act_bytes
    fast_act = 2.0 * n_points * tokens_per_tick * per_token[codec] * act_bytes
    dense_w = float(sum(math.prod(int(s) for s in shape) for shape in weight_shapes)) * grad_bytes
    if grad_codec == "powersgd":
        fast_w = float(
            sum(weight_update_elements(s, grad_rank, min_compression_rate)[0] for s in weight_shapes)
        )
        fast_w *= grad_bytes
    else:
        fast_w = dense_w
    basis = float(n_points * hidden * rank * act_bytes) if codec == "lowrank" else 0.0
    return AnalyticBytes(
        fast_activations=fast_act,
        fast_weights=updates_per_tick * fast_w,
        fire_activations=dense_act,
        fire_basis=basis,
        fire_weights=fire_updates * dense_w,
        dense_activations=dense_act,
        dense_weights=updates_per_tick * dense_w,
        cadence=cadence,
        anchor=anchor,
    )


def qwen25_15b_shapes() -> dict:
    """Qwen2.5-1.5B (and -Math-1.5B): hidden 1536, 28 layers, MLP 8960, 12 heads / 2 KV heads of 128,
    vocab 151936, tied embeddings. Returns ``hidden``, ``layers`` and every parameter's shape."""
    d, layers, mlp, heads, kv_heads, head_dim, vocab = 1536, 28, 8960, 12, 2, 128, 151936
    q, kv = heads * head_dim, kv_heads * head_dim
    per_layer = [
        (q, d),
        (q,),
        (kv, d),
        (kv,),
        (kv, d),
        (kv,),
        (d, q),  # q/k/v (with biases), o
        (mlp, d),
        (mlp, d),
        (d, mlp),  # gate, up, down
        (d,),
        (d,),  # input / post-attention RMSNorm
    ]
    shapes = [(vocab, d)] + per_layer * layers + [(d,)]
    return {"hidden": d, "layers": layers, "weight_shapes": shapes}


def pair_a_summary(
    tokens_per_tick: int = 512 * 8 * (1024 + 3072), updates_per_tick: int = 1
) -> AnalyticBytes:
    """Pair A of the note: Qwen2.5-Math-1.5B, rank 77, PowerSGD rank 77, K = 20; tokens at the budget."""
    shapes = qwen25_15b_shapes()
    return analytic_tick_bytes(
        shapes["hidden"],
        shapes["layers"],
        shapes["weight_shapes"],
        tokens_per_tick,
        rank=77,
        grad_rank=77,
        cadence=20,
        updates_per_tick=updates_per_tick,
    )


def main() -> None:
    shapes = qwen25_15b_shapes()
    n_params = sum(math.prod(s) for s in shapes["weight_shapes"])
    print(
        f"Qwen2.5-1.5B: {n_params / 1e9:.3f} B parameters, hidden {shapes['hidden']}, "
        f"{shapes['layers']} layers"
    )
    print("pair A: rank 77, PowerSGD rank 77, K = 20, bf16 activations, fp32 gradients")
    print(f"{'tokens/tick':>14} {'fast GB':>9} {'fire GB':>9} {'dense GB':>9} {'ratio vs dense':>15}")
    for tokens in (512 * 8 * 1024, 512 * 8 * 2048, 512 * 8 * (1024 + 3072)):
        b = pair_a_summary(tokens)
        print(
            f"{tokens:>14,} {b.fast_tick / 1e9:>9.2f} {b.fire_tick / 1e9:>9.2f} {b.dense_tick / 1e9:>9.2f} "
            f"{b.ratio_vs_dense:>15.4f}"
        )


if __name__ == "__main__":
    main()
