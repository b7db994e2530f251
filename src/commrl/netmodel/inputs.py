"""The network model's inputs per tick: bytes per channel and compute seconds, from tracked runs or from the
analytic ledger.

- ``measured_inputs``: a pair's training runs in MLflow (read through ``commrl.report.runs``): per tick
  ``comm/bytes_activations - comm/bytes_basis_refresh`` (activations, forward and backward),
  ``comm/bytes_basis_refresh``, ``comm/bytes_weights`` and the measured ``time/train_s``, ``time/sample_s``.
  Step ``s`` is the tick that produced the model validated at step ``s`` (``val/acc``, step 0 = the base).
- ``analytic_inputs``: ``analytic_tick_bytes`` (``commrl.compression.ledger``) for a model shape, with the
  anchor's schedule (tick ``t = s - 1`` fires when ``t % K == 0``) and compute seconds given by the user.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from commrl import tracking
from commrl.compression.config import POINTS, compression_layers
from commrl.compression.ledger import AnalyticBytes, analytic_tick_bytes
from commrl.netmodel.cost import ChannelBytes, CommTime, comm_time, tick_time
from commrl.netmodel.links import Layout, Link, NetModelError
from commrl.report.runs import PairRuns, Series, TrainRun

ACTIVATIONS, BASIS, WEIGHTS = "comm/bytes_activations", "comm/bytes_basis_refresh", "comm/bytes_weights"
TRAIN_S, SAMPLE_S = "time/train_s", "time/sample_s"
TICK_METRICS: tuple[str, ...] = (ACTIVATIONS, BASIS, WEIGHTS, TRAIN_S, SAMPLE_S)


@dataclass(frozen=True)
class TickInputs:
    """Per tick (``steps``, ascending, >= 1): bytes per channel and compute seconds (equal-length arrays)."""

    steps: np.ndarray
    activations: np.ndarray
    basis: np.ndarray
    weights: np.ndarray
    train_s: np.ndarray
    sample_s: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.steps)
        for field in ("activations", "basis", "weights", "train_s", "sample_s"):
            values = getattr(self, field)
            if len(values) != n:
                raise NetModelError(field, f"{field} has {len(values)} ticks, steps has {n}")
            if not np.all(np.isfinite(values)) or np.any(values < 0):
                raise NetModelError(field, f"{field} must be finite and >= 0 at every tick")

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def bytes(self) -> ChannelBytes:
        return ChannelBytes(self.activations, self.basis, self.weights)

    def comm(self, layout: Layout, link: Link) -> CommTime:
        """Per tick ``comm_time`` (``commrl.netmodel.cost``)."""
        return comm_time(self.bytes, layout, link)

    def tick_times(self, layout: Layout, link: Link, overlap: bool) -> np.ndarray:
        """Per tick ``tick_time(train_s, sample_s, comm_time.total, overlap)``."""
        return np.asarray(tick_time(self.train_s, self.sample_s, self.comm(layout, link).total, overlap))


def _series(client, run: TrainRun, key: str) -> Series | None:
    """``key`` as the report loaded it, else its history read from the store; None when not logged."""
    if key in run.metrics:
        return run.metrics[key]
    history = client.get_metric_history(run.run_id, key)
    return Series.from_points([(m.step, m.value) for m in history]) if history else None


def _on_steps(series: Series, steps: np.ndarray) -> np.ndarray:
    return series.values[np.searchsorted(series.steps, steps)]


def run_inputs(client, run: TrainRun) -> tuple[TickInputs | None, str | None]:
    """One run's ``TickInputs`` on the steps >= 1 where all five metrics are logged
    (``comm/bytes_basis_refresh`` missing counts as 0); ``(None, why)`` when the run lacks a metric."""
    found = {key: _series(client, run, key) for key in TICK_METRICS}
    missing = [k for k, s in found.items() if s is None and k != BASIS]
    if missing:
        return None, f"run {run.name} has no {', '.join(missing)}"
    common = set.intersection(*(set(s.steps.tolist()) for s in found.values() if s is not None))
    steps = np.array(sorted(s for s in common if s >= 1), dtype=np.int64)
    if not len(steps):
        return None, f"run {run.name} logs {', '.join(TICK_METRICS)} at no common tick >= 1"
    basis = _on_steps(found[BASIS], steps) if found[BASIS] is not None else np.zeros(len(steps))
    activations = _on_steps(found[ACTIVATIONS], steps) - basis
    inputs = TickInputs(
        steps,
        activations,
        basis,
        _on_steps(found[WEIGHTS], steps),
        _on_steps(found[TRAIN_S], steps),
        _on_steps(found[SAMPLE_S], steps),
    )
    return inputs, (None if found[BASIS] is not None else f"run {run.name}: no {BASIS}, counted as 0")


def store_client(tracking_uri: str | None):
    """An MLflow client on the store; ``NetModelError`` for a sqlite store that does not exist (instead of
    creating an empty one)."""
    uri = tracking_uri or tracking.default_tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise NetModelError(
            "tracking_uri", f"no MLflow store at {uri}; train the pair first, or pass the store's URI"
        )
    return tracking.client(uri)


def measured_inputs(
    runs: PairRuns, conditions: Sequence[str], tracking_uri: str | None
) -> tuple[dict[str, dict[str, TickInputs]], list[str]]:
    """``condition -> seed -> TickInputs`` of the pair's training runs, and notes on runs left out."""
    client = store_client(tracking_uri)
    found: dict[str, dict[str, TickInputs]] = {}
    notes: list[str] = []
    for condition in conditions:
        for run in runs.runs_of(condition):
            inputs, note = run_inputs(client, run)
            if note:
                notes.append(f"{runs.pair}: {note}" + ("" if inputs else "; left out of the network model"))
            if inputs is not None:
                found.setdefault(condition, {})[run.seed] = inputs
    return found, notes


def qwen2_weight_shapes(
    hidden_size: int,
    num_hidden_layers: int,
    intermediate_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    vocab_size: int,
    tie_word_embeddings: bool,
) -> list[tuple[int, ...]]:
    """Every parameter's shape of a Qwen2 decoder (q/k/v projections with biases, o without; SwiGLU MLP;
    two RMSNorms per layer and a final one; one embedding when tied, else a separate LM head):
    ``q = heads * head_dim``, ``kv = kv_heads * head_dim``, ``head_dim = hidden / heads``."""
    head_dim = hidden_size // num_attention_heads
    q, kv, d = num_attention_heads * head_dim, num_key_value_heads * head_dim, hidden_size
    per_layer = [(q, d), (q,), (kv, d), (kv,), (kv, d), (kv,), (d, q)]
    per_layer += [(intermediate_size, d), (intermediate_size, d), (d, intermediate_size), (d,), (d,)]
    head = [] if tie_word_embeddings else [(vocab_size, d)]
    return [(vocab_size, d), *per_layer * num_hidden_layers, (d,), *head]


@dataclass(frozen=True)
class Qwen2Shape:
    """The architecture constants of a Qwen2 model's ``config.json``."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool

    def __post_init__(self) -> None:
        for field in (
            "hidden_size",
            "num_hidden_layers",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
        ):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise NetModelError(f"model.{field}", f"model.{field}={value!r} must be an integer >= 1")
        if self.hidden_size % self.num_attention_heads:
            raise NetModelError(
                "model.num_attention_heads",
                f"model.hidden_size={self.hidden_size} is not divisible by "
                f"model.num_attention_heads={self.num_attention_heads}",
            )
        if not isinstance(self.tie_word_embeddings, bool):
            raise NetModelError(
                "model.tie_word_embeddings", "model.tie_word_embeddings must be true or false"
            )

    def weight_shapes(self) -> list[tuple[int, ...]]:
        return qwen2_weight_shapes(
            self.hidden_size,
            self.num_hidden_layers,
            self.intermediate_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.vocab_size,
            self.tie_word_embeddings,
        )


@dataclass(frozen=True)
class AnalyticSpec:
    """What ``analytic_tick_bytes`` needs besides the shape: the batch's tokens per tick and the method's
    knobs (``method.md`` §2-§3; element sizes in bytes: bf16 activations, fp32 gradients)."""

    model: Qwen2Shape
    tokens_per_tick: int
    rank: int
    grad_rank: int
    cadence: int
    act_bytes: int = 2
    grad_bytes: int = 4
    min_compression_rate: float = 2.0
    updates_per_tick: int = 1
    points: str = "all"

    def __post_init__(self) -> None:
        for field in ("tokens_per_tick", "rank", "grad_rank", "cadence", "act_bytes", "grad_bytes"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise NetModelError(
                    f"analytic.{field}", f"analytic.{field}={value!r} must be an integer >= 1"
                )
        if self.rank >= self.model.hidden_size:
            raise NetModelError(
                "analytic.rank",
                f"analytic.rank={self.rank} must be below model.hidden_size={self.model.hidden_size}",
            )
        if self.points not in POINTS:
            raise NetModelError(
                "analytic.points", f"analytic.points={self.points!r} is not one of {', '.join(POINTS)}"
            )

    @property
    def n_points(self) -> int:
        """``P``: ``L`` compression points under ``points: all``, ``L - 1`` under ``boundaries``."""
        return len(compression_layers(self.model.num_hidden_layers, self.points))

    def tick_bytes(self) -> AnalyticBytes:
        """``analytic_tick_bytes`` of this shape and method (lowrank + PowerSGD + anchor, the method)."""
        return analytic_tick_bytes(
            self.model.hidden_size,
            self.model.num_hidden_layers,
            self.model.weight_shapes(),
            self.tokens_per_tick,
            rank=self.rank,
            grad_rank=self.grad_rank,
            cadence=self.cadence,
            act_bytes=self.act_bytes,
            grad_bytes=self.grad_bytes,
            min_compression_rate=self.min_compression_rate,
            updates_per_tick=self.updates_per_tick,
            points=self.points,
        )


@dataclass(frozen=True)
class Compute:
    """Compute seconds per tick: ``train_s`` (dense's trainer), ``method_train_s`` (the method's, None: the
    same as dense's), ``sample_s`` (generation, None: not included), ``source`` (where they come from).
    ``train_s`` None means unknown: the model then gives communication time only."""

    train_s: float | None
    method_train_s: float | None = None
    sample_s: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        for field in ("train_s", "method_train_s", "sample_s"):
            value = getattr(self, field)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise NetModelError(
                    f"compute.{field}",
                    f"compute.{field}={value!r} is invalid: seconds per tick, a finite number >= 0; "
                    "give the measured time of your hardware",
                )
        if self.train_s is None and (self.method_train_s is not None or self.sample_s is not None):
            raise NetModelError(
                "compute.train_s", "compute.train_s is missing: give it with method_train_s / sample_s"
            )

    @property
    def known(self) -> bool:
        return self.train_s is not None

    def describe(self) -> str:
        method = "the same" if self.method_train_s is None else f"{self.method_train_s:g} s"
        sample = "not included" if self.sample_s is None else f"{self.sample_s:g} s"
        source = f" (source: {self.source})" if self.source else ""
        return (
            f"compute per tick: dense trainer {self.train_s:g} s, the method's {method}, "
            f"sampling {sample}{source}"
        )


def analytic_inputs(spec: AnalyticSpec, compute: Compute, ticks: int) -> dict[str, TickInputs]:
    """``dense`` and ``method`` per tick ``1..ticks`` from ``spec.tick_bytes()``: dense sends
    ``dense_activations`` and ``dense_weights`` every tick; the method's tick ``t = s - 1`` is an anchor fire
    (``fire_activations``, ``fire_basis``, ``fire_weights``) when ``t % K == 0``, else a fast tick
    (``fast_activations``, ``fast_weights``). Compute seconds are constant per tick (0 where unknown)."""
    b = spec.tick_bytes()
    steps = np.arange(1, ticks + 1, dtype=np.int64)
    fire = (steps - 1) % b.cadence == 0
    train = compute.train_s or 0.0
    method_train = compute.method_train_s if compute.method_train_s is not None else train
    sample = np.full(ticks, compute.sample_s or 0.0)
    dense = TickInputs(
        steps,
        np.full(ticks, b.dense_activations),
        np.zeros(ticks),
        np.full(ticks, b.dense_weights),
        np.full(ticks, train),
        sample,
    )
    method = TickInputs(
        steps,
        np.where(fire, b.fire_activations, b.fast_activations),
        np.where(fire, b.fire_basis, 0.0),
        np.where(fire, b.fire_weights, b.fast_weights),
        np.full(ticks, method_train),
        sample,
    )
    return {"dense": dense, "method": method}
