"""The network model's inputs per tick: bytes per channel and compute seconds, from tracked runs or from the
analytic ledger.

- ``measured_inputs``: a pair's training runs in MLflow (read through ``commrl.report.runs``): per tick
  ``comm/bytes_activations - comm/bytes_basis_refresh`` (activations, every counted pass),
  ``comm/bytes_basis_refresh``, ``comm/bytes_weights`` and the measured ``time/train_s``, ``time/sample_s``;
  the boundary traversals per tick from the config's ``passes`` and the run's ``anchor/fire``; the
  parameters ``rs_ag`` all-gathers, the dense condition's ``comm/bytes_weights`` (the same updates, dense)
  scaled by the config's ``element_bytes`` (``params / grads``: the parameters' element size over the
  gradients' the ledger counts).
  Step ``s`` is the tick that produced the model validated at step ``s`` (``val/acc``, step 0 = the base).
- ``analytic_inputs``: for a model shape, the weight updates and basis refresh of ``analytic_tick_bytes``
  (``commrl.compression.ledger``), the activations of every pass verl's engine counts (``engine_passes``),
  the largest pipeline stage's share of the update (``Qwen2Shape.stage_shapes``), the parameters ``rs_ag``
  all-gathers at ``analytic.param_bytes`` an element, with the anchor's schedule (tick ``t = s - 1`` fires
  when ``t % K == 0``) and compute seconds given by the user.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from commrl import tracking
from commrl.compression.config import POINTS, compression_layers
from commrl.compression.ledger import AnalyticBytes, analytic_tick_bytes, weight_update_elements
from commrl.netmodel.cost import ChannelBytes, CommTime, comm_time, tick_time
from commrl.netmodel.links import Layout, Link, NetModelError, finite_number
from commrl.report.runs import PairRuns, Series, TrainRun

ACTIVATIONS, BASIS, WEIGHTS = "comm/bytes_activations", "comm/bytes_basis_refresh", "comm/bytes_weights"
TRAIN_S, SAMPLE_S, FIRE = "time/train_s", "time/sample_s", "anchor/fire"
TICK_METRICS: tuple[str, ...] = (ACTIVATIONS, BASIS, WEIGHTS, TRAIN_S, SAMPLE_S, FIRE)
OPTIONAL_METRICS = (BASIS, FIRE)  # missing: 0 (no basis refresh, no fire)


@dataclass(frozen=True)
class TickInputs:
    """Per tick (``steps``, ascending, >= 1): bytes per channel, the boundary traversals ``passes`` that
    carry the activations, compute seconds, and optionally the largest pipeline stage's share of the weight
    update (``stage_weights``; None: ``weights / S``), the tick's updates sent dense (``params``, at the
    gradients' element size; None: ``weights``, a dense update) and the largest stage's share of them
    (``stage_params``; None: ``params / S``) (equal-length arrays), and ``param_scale``, the parameters'
    element size over the gradients' (``param_bytes / grad_bytes``): ``rs_ag`` all-gathers
    ``param_scale * params`` bytes (``commrl.netmodel.cost.ChannelBytes``)."""

    steps: np.ndarray
    activations: np.ndarray
    basis: np.ndarray
    weights: np.ndarray
    train_s: np.ndarray
    sample_s: np.ndarray
    passes: np.ndarray
    stage_weights: np.ndarray | None = None
    params: np.ndarray | None = None
    stage_params: np.ndarray | None = None
    param_scale: float = 1.0

    def __post_init__(self) -> None:
        if not finite_number(self.param_scale) or self.param_scale <= 0:
            raise NetModelError(
                "param_scale", f"param_scale={self.param_scale!r} must be a finite number > 0"
            )
        n = len(self.steps)
        optional = ("stage_weights", "params", "stage_params")
        for field in ("activations", "basis", "weights", "train_s", "sample_s", "passes", *optional):
            values = getattr(self, field)
            if values is None:
                continue
            if len(values) != n:
                raise NetModelError(field, f"{field} has {len(values)} ticks, steps has {n}")
            if not np.all(np.isfinite(values)) or np.any(values < 0):
                raise NetModelError(field, f"{field} must be finite and >= 0 at every tick")

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def bytes(self) -> ChannelBytes:
        return ChannelBytes(
            self.activations,
            self.basis,
            self.weights,
            self.passes,
            self.stage_weights,
            self.params,
            self.stage_params,
            self.param_scale,
        )

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


def run_inputs(
    client,
    run: TrainRun,
    passes: Mapping[str, int],
    params: float | None = None,
    param_scale: float = 1.0,
) -> tuple[TickInputs | None, str | None]:
    """One run's ``TickInputs`` on the steps >= 1 where all its metrics are logged
    (``comm/bytes_basis_refresh`` and ``anchor/fire`` missing count as 0); boundary traversals per tick
    ``passes["fire"]`` where ``anchor/fire`` is set, else ``passes["fast"]``; the tick's updates sent dense
    ``params`` (a dense run's update of a tick, ``dense_params``), where the anchor fires the tick's own
    dense update (None: the run's updates are dense), all-gathered at ``param_scale`` times their bytes;
    ``(None, why)`` when the run lacks a metric."""
    found = {key: _series(client, run, key) for key in TICK_METRICS}
    missing = [k for k, s in found.items() if s is None and k not in OPTIONAL_METRICS]
    if missing:
        return None, f"run {run.name} has no {', '.join(missing)}"
    common = set.intersection(*(set(s.steps.tolist()) for s in found.values() if s is not None))
    steps = np.array(sorted(s for s in common if s >= 1), dtype=np.int64)
    if not len(steps):
        return None, f"run {run.name} logs {', '.join(TICK_METRICS)} at no common tick >= 1"
    basis = _on_steps(found[BASIS], steps) if found[BASIS] is not None else np.zeros(len(steps))
    fire = _on_steps(found[FIRE], steps) > 0 if found[FIRE] is not None else np.zeros(len(steps), bool)
    activations = _on_steps(found[ACTIVATIONS], steps) - basis
    weights = _on_steps(found[WEIGHTS], steps)
    inputs = TickInputs(
        steps,
        activations,
        basis,
        weights,
        _on_steps(found[TRAIN_S], steps),
        _on_steps(found[SAMPLE_S], steps),
        np.where(fire, passes["fire"], passes["fast"]),
        params=None if params is None else np.where(fire, weights, params),
        param_scale=param_scale,
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


def dense_params(dense: Mapping[str, TickInputs]) -> tuple[float | None, str | None]:
    """A tick's updates sent dense: ``P = median`` of the dense runs' per-tick ``comm/bytes_weights``
    (their updates are dense: the parameter count at the gradients' element size, per update; the same
    every tick and seed; ``rs_ag`` all-gathers ``param_scale * P``); a note when they differ;
    ``(None, None)`` without dense runs."""
    values = np.concatenate([t.weights for t in dense.values()]) if dense else np.zeros(0)
    if not len(values):
        return None, None
    note = None
    if values.min() != values.max():
        note = (
            f"dense's comm/bytes_weights differ between ticks ({values.min():.6g}-{values.max():.6g}); "
            "the median stands for the dense update whose parameters rs_ag all-gathers"
        )
    return float(np.median(values)), note


def measured_inputs(
    runs: PairRuns,
    conditions: Sequence[str],
    tracking_uri: str | None,
    passes: Mapping[str, int],
    param_scale: float,
) -> tuple[dict[str, dict[str, TickInputs]], list[str]]:
    """``condition -> seed -> TickInputs`` of the pair's training runs (``run_inputs``, the all-gather at
    ``param_scale``), and notes on runs left out. The first condition is dense: its runs give the others'
    dense updates (``dense_params``)."""
    client = store_client(tracking_uri)
    found: dict[str, dict[str, TickInputs]] = {}
    notes: list[str] = []

    def read(condition: str, params: float | None) -> None:
        for run in runs.runs_of(condition):
            inputs, note = run_inputs(client, run, passes, params, param_scale)
            if note:
                notes.append(f"{runs.pair}: {note}" + ("" if inputs else "; left out of the network model"))
            if inputs is not None:
                found.setdefault(condition, {})[run.seed] = inputs

    read(conditions[0], None)
    params, note = dense_params(found.get(conditions[0], {}))
    notes += [f"{runs.pair}: {note}"] if note else []
    for condition in conditions[1:]:
        read(condition, params)
    return found, notes


def qwen2_layer_shapes(
    hidden_size: int, intermediate_size: int, num_attention_heads: int, num_key_value_heads: int
) -> list[tuple[int, ...]]:
    """One Qwen2 decoder layer's parameter shapes (q/k/v projections with biases, o without; SwiGLU MLP;
    two RMSNorms): ``q = heads * head_dim``, ``kv = kv_heads * head_dim``, ``head_dim = hidden / heads``."""
    head_dim = hidden_size // num_attention_heads
    q, kv, d = num_attention_heads * head_dim, num_key_value_heads * head_dim, hidden_size
    attention = [(q, d), (q,), (kv, d), (kv,), (kv, d), (kv,), (d, q)]
    return [*attention, (intermediate_size, d), (intermediate_size, d), (d, intermediate_size), (d,), (d,)]


def qwen2_weight_shapes(
    hidden_size: int,
    num_hidden_layers: int,
    intermediate_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    vocab_size: int,
    tie_word_embeddings: bool,
) -> list[tuple[int, ...]]:
    """Every parameter's shape of a Qwen2 decoder: the embedding, ``qwen2_layer_shapes`` per layer, the final
    RMSNorm, and a separate LM head unless the embeddings are tied."""
    layer = qwen2_layer_shapes(hidden_size, intermediate_size, num_attention_heads, num_key_value_heads)
    head = [] if tie_word_embeddings else [(vocab_size, hidden_size)]
    return [(vocab_size, hidden_size), *layer * num_hidden_layers, (hidden_size,), *head]


def stage_layers(layers: int, stages: int) -> list[int]:
    """Decoder layers per pipeline stage, as even as possible: ``floor(L / S)`` each, the ``L mod S`` left
    over to the middle stages first, then to the first (the first stage also holds the embedding, the last
    the final norm and the LM head)."""
    base, extra = divmod(layers, stages)
    counts = [base] * stages
    for s in [*range(1, stages - 1), 0][:extra]:
        counts[s] += 1
    return counts


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

    def stage_shapes(self, stages: int) -> list[list[tuple[int, ...]]]:
        """Each pipeline stage's parameter shapes: its ``stage_layers`` decoder layers, the embedding on the
        first stage, the final RMSNorm and the LM head on the last; tied embeddings on ``S > 1`` stages put
        a copy of the embedding there as the head (Megatron-LM's shared embedding), reduced with that
        stage's update."""
        layer = qwen2_layer_shapes(
            self.hidden_size, self.intermediate_size, self.num_attention_heads, self.num_key_value_heads
        )
        embedding = (self.vocab_size, self.hidden_size)
        out = [layer * n for n in stage_layers(self.num_hidden_layers, stages)]
        out[0] = [embedding, *out[0]]
        head = [] if self.tie_word_embeddings and stages == 1 else [embedding]
        out[-1] = [*out[-1], (self.hidden_size,), *head]
        return out


def engine_passes(hidden: int, rank: int) -> dict[str, tuple[int, ...]]:
    """Elements per token and compression point of each boundary traversal that verl's engine
    (``commrl.verl_ext.engine``) counts in one tick of pair A's resolved config (configs/verl/pair/A.yaml:
    old log-probs recomputed by the trainer, ``rl.behaviour_logprobs: trainer``; the KL loss's reference
    pass through the actor's codec, ``method.kl_ref_forward: codec``; one mini-batch per tick, and the same
    traversals of all the tick's tokens over ``U`` mini-batches), in order:

    - ``fast``: the old-log-prob forward, the reference forward, the training forward and backward, ``r``
      each;
    - ``fire``: the old-log-prob and reference forwards ``r`` (the reference's dense twin is not counted), the
      anchor's dense replay forward and backward ``d`` (of the first mini-batch; the later ones' training
      passes are dense, ``d``);
    - ``dense`` (identity codec): the same four traversals at ``d``.
    """
    return {"fast": (rank,) * 4, "fire": (rank, rank, hidden, hidden), "dense": (hidden,) * 4}


ELEMENT_SIZES = (1, 2, 4, 8)  # bytes per element of a torch dtype (fp8 / bf16, fp16 / fp32 / fp64)
PARAM_BYTES_WHAT = (
    "the element size in bytes of the parameters FSDP (rs_ag) all-gathers, its mixed-precision "
    "param_dtype: 2 for bf16 (verl's FSDP default), 4 for fp32"
)


def element_size(value: object, field: str, what: str) -> int:
    """``value`` if it is a dtype's element size in bytes (``ELEMENT_SIZES``), else ``NetModelError`` naming
    ``field``, what it is (``what``) and the sizes allowed."""
    sizes = ", ".join(str(n) for n in ELEMENT_SIZES)
    if value is None:
        raise NetModelError(field, f"{field} is missing: {what}")
    if isinstance(value, bool) or not isinstance(value, int) or value not in ELEMENT_SIZES:
        raise NetModelError(field, f"{field}={value!r} is invalid: one of {sizes}, {what}")
    return value


@dataclass(frozen=True)
class AnalyticSpec:
    """What ``analytic_tick_bytes`` needs besides the shape: the batch's tokens per tick and the method's
    knobs (``method.md`` §2-§3; element sizes in bytes: bf16 activations, fp32 gradients), and
    ``param_bytes``, the element size at which FSDP (``rs_ag``) all-gathers the parameters (its
    mixed-precision ``param_dtype``; no default: the config says which, see configs/netmodel/pair_A.yaml)."""

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
    param_bytes: int | None = None

    def __post_init__(self) -> None:
        element_size(self.param_bytes, "analytic.param_bytes", PARAM_BYTES_WHAT)
        integers = (
            "tokens_per_tick",
            "rank",
            "grad_rank",
            "cadence",
            "act_bytes",
            "grad_bytes",
            "updates_per_tick",
        )
        for field in integers:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise NetModelError(
                    f"analytic.{field}", f"analytic.{field}={value!r} must be an integer >= 1"
                )
        rate = self.min_compression_rate
        if not finite_number(rate) or rate <= 0:
            raise NetModelError(
                "analytic.min_compression_rate",
                f"analytic.min_compression_rate={rate!r} must be a finite number > 0 (PyTorch's PowerSGD "
                "compresses a matrix when (m + n) r * rate < m n; its default is 2)",
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
    def param_scale(self) -> float:
        """``param_bytes / grad_bytes``: the all-gathered parameters' bytes per byte of the dense update."""
        assert self.param_bytes is not None  # __post_init__
        return self.param_bytes / self.grad_bytes

    @property
    def n_points(self) -> int:
        """``P``: ``L`` compression points under ``points: all``, ``L - 1`` under ``boundaries``."""
        return len(compression_layers(self.model.num_hidden_layers, self.points))

    def passes(self) -> dict[str, tuple[int, ...]]:
        """``engine_passes`` of this shape and rank: per tick kind (fast, fire, dense) the traversals."""
        return engine_passes(self.model.hidden_size, self.rank)

    def activation_bytes(self) -> dict[str, float]:
        """Per tick kind the activation bytes the engine counts: ``A = P T b sum_k e_k`` over ``passes``."""
        scale = self.n_points * self.tokens_per_tick * self.act_bytes
        return {kind: float(scale * sum(elements)) for kind, elements in self.passes().items()}

    def stage_weight_bytes(self, stages: int) -> dict[str, float]:
        """Per tick kind the largest stage's share of the weight update (``Qwen2Shape.stage_shapes``):
        ``b_g max_s sum_{p in s} e(p)``, ``e`` PowerSGD's elements on a fast tick and ``numel`` on dense's
        and on a fire tick, ``updates_per_tick`` updates each, as ``tick_bytes``."""
        per_stage = self.model.stage_shapes(stages)

        def largest(elements: Callable[[tuple[int, ...]], int]) -> float:
            return float(self.grad_bytes * max(sum(elements(p) for p in shapes) for shapes in per_stage))

        dense = largest(math.prod)
        fast = largest(lambda p: weight_update_elements(p, self.grad_rank, self.min_compression_rate)[0])
        u = self.updates_per_tick
        return {"fast": u * fast, "fire": u * dense, "dense": u * dense}

    def tick_bytes(self) -> AnalyticBytes:
        """``analytic_tick_bytes`` of this shape and method (lowrank + PowerSGD + anchor, the method) as
        verl's engine counts it: its weight updates and basis refresh; its activations count the training
        passes only (``activation_bytes`` has every pass the engine counts). A fire tick logs
        ``updates_per_tick`` dense updates: the engine (``commrl.verl_ext.engine``, ``train_batch``) replays
        the first mini-batch dense and updates the later ones dense; the local driver (``commrl.rl.trainer``)
        replays the whole batch as one dense update, ``analytic_tick_bytes``' default ``fire_updates=1``."""
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
            fire_updates=self.updates_per_tick,
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


def analytic_inputs(spec: AnalyticSpec, compute: Compute, ticks: int, stages: int) -> dict[str, TickInputs]:
    """``dense`` and ``method`` per tick ``1..ticks``: dense's tick every tick; the method's tick
    ``t = s - 1`` is an anchor fire when ``t % K == 0`` (with the basis refresh), else a fast tick.
    Activations and their traversals from ``spec.activation_bytes()`` and ``spec.passes()``, weights and the
    basis from ``spec.tick_bytes()``, the largest of ``stages`` stages' share of the weights from
    ``spec.stage_weight_bytes(stages)``; the parameters ``rs_ag`` all-gathers, the dense updates every tick
    (the method's fire tick is dense) at ``spec.param_scale`` of their bytes (``param_bytes`` an element).
    Compute seconds are constant per tick (0 where unknown)."""
    b, act, share = spec.tick_bytes(), spec.activation_bytes(), spec.stage_weight_bytes(stages)
    passes = {kind: len(p) for kind, p in spec.passes().items()}
    steps = np.arange(1, ticks + 1, dtype=np.int64)
    fire = (steps - 1) % b.cadence == 0
    train = compute.train_s or 0.0
    method_train = compute.method_train_s if compute.method_train_s is not None else train
    sample = np.full(ticks, compute.sample_s or 0.0)

    def per_tick(by_kind: dict[str, float]) -> np.ndarray:
        return np.where(fire, by_kind["fire"], by_kind["fast"]).astype(np.float64)

    dense = TickInputs(
        steps,
        np.full(ticks, act["dense"]),
        np.zeros(ticks),
        np.full(ticks, b.dense_weights),
        np.full(ticks, train),
        sample,
        np.full(ticks, passes["dense"]),
        np.full(ticks, share["dense"]),
        param_scale=spec.param_scale,
    )
    compressed = TickInputs(
        steps,
        per_tick(act),
        np.where(fire, b.fire_basis, 0.0),
        np.where(fire, b.fire_weights, b.fast_weights),
        np.full(ticks, method_train),
        sample,
        np.where(fire, passes["fire"], passes["fast"]),
        per_tick(share),
        np.full(ticks, b.dense_weights),
        np.full(ticks, share["dense"]),
        spec.param_scale,
    )
    return {"dense": dense, "method": compressed}
