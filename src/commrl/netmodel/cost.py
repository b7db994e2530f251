"""The network cost of one tick: pure functions of bytes, a link and a layout (alpha-beta model).

Every channel costs ``latency + bytes / bandwidth`` with the collective's standard cost (Thakur, Rabenseifner
and Gropp, "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005; Patarasuk and Yuan,
"Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 2009). ``alpha`` is the link's
latency per message (s), ``beta`` its bandwidth per direction (bytes/s), ``n`` the ranks of a collective.
A channel with no bytes sends no message and costs nothing.

The tick's channels are the byte ledger's (``commrl.compression.ledger``), whose counts are model-level:
activations of every token of the tick at every one of the ``P`` compression points, summed over the
``n`` boundary traversals the ledger counts (each counted pass's forward, and the backward of a training
pass; ``comm/bytes_activations - comm/bytes_basis_refresh``); the basis refresh, ``d * r`` per point
(``comm/bytes_basis_refresh``); and the weight update of the whole model as one replica sends it
(``comm/bytes_weights``). On a layout of ``S`` stages, ``D`` data-parallel replicas and ``m``
micro-batches per pass and replica:

- activations: each traversal carries, per boundary and replica, one point's share ``A_k / (P D)`` in
  ``m`` micro-batches; a pipelined schedule (GPipe, 1F1B) crosses the ``S - 1`` boundaries in
  ``m + S - 2`` transfers of ``A_k / (P D m)`` bytes on its critical path;
- basis refresh: each boundary's ``d * r`` basis, ``R / P`` bytes, one message, boundaries concurrently;
- weights: each stage reduces its own parameters' share across the ``D`` replicas, stages concurrently, so the
  largest stage's share sets the time (``links.COLLECTIVES``): ``allreduce`` (DDP) ring all-reduces the update
  (a compressed one as PowerSGD's DDP hook does, its factors instead of the gradients); ``rs_ag`` (FSDP)
  reduce-scatters the dense gradients ``u`` times a tick (``Layout.reduces`` None: once per micro-batch, ``u =
  m``, as verl's FSDP engine does), and a compressed update's factors are all-reduced after that (verl's
  engine compresses the gradient shards FSDP has reduced: FSDP has no hook that would send the factors
  instead), then all-gathers the parameters, dense, at their own element size, ``g`` times a tick: ``c P``
  bytes each, ``P`` the tick's updates sent dense (the parameter count at the gradients' element size, per
  optimizer step) and ``c = param_bytes / grad_bytes`` (FSDP's mixed-precision ``param_dtype`` over its
  ``reduce_dtype``: bf16 over fp32, ``c = 1/2``, in verl's FSDP engine by default); ``g = n m``
  (``Layout.gathers`` None: FSDP's ``reshard_after_forward``, verl's default, gathers them for every
  micro-batch of every traversal, the reference model's as the policy's), or as given. The gathers and
  reduce-scatters are the same for dense and the method: they are what the method does not compress;
- channels run one after the other (activations during the passes, the update after them).

Compute time is an input, not modelled. ``train_s`` is the trainer's compute that communication can hide
behind; ``sample_s`` (generation) runs before it and hides nothing. Two bounds: no overlap,
``T = sample + train + comm``; full overlap, ``T = sample + max(train, comm)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from commrl.netmodel.links import Layout, Link, NetModelError, finite_number

Value = float | np.ndarray  # a number of bytes or seconds, or one per tick


def _sends(nbytes: Value) -> Value:
    """1 where there are bytes to send (a message goes out), else 0."""
    return np.asarray(nbytes) > 0


def p2p_time(nbytes: Value, link: Link, messages: Value = 1) -> Value:
    """Point to point: ``t = m alpha + bytes / beta`` for ``m`` messages carrying ``bytes`` in all; 0 when
    there are no bytes."""
    return messages * link.latency_s * _sends(nbytes) + nbytes / link.bytes_per_s


def ring_allreduce_time(nbytes: Value, n: int, link: Link) -> Value:
    """Ring all-reduce of ``bytes`` over ``n`` ranks: ``t = 2 (n - 1) alpha + 2 (n - 1) / n * bytes / beta``
    (a reduce-scatter and an all-gather of ``n - 1`` steps each, ``bytes / n`` per step); 0 for ``n = 1``."""
    return 2 * (n - 1) * link.latency_s * _sends(nbytes) + 2 * (n - 1) / n * nbytes / link.bytes_per_s


def reduce_scatter_time(nbytes: Value, n: int, link: Link) -> Value:
    """Ring reduce-scatter: ``t = (n - 1) alpha + (n - 1) / n * bytes / beta``; 0 for ``n = 1``."""
    return (n - 1) * link.latency_s * _sends(nbytes) + (n - 1) / n * nbytes / link.bytes_per_s


def all_gather_time(nbytes: Value, n: int, link: Link) -> Value:
    """Ring all-gather: ``t = (n - 1) alpha + (n - 1) / n * bytes / beta``; 0 for ``n = 1``."""
    return (n - 1) * link.latency_s * _sends(nbytes) + (n - 1) / n * nbytes / link.bytes_per_s


def activation_time(nbytes: Value, passes: Value, layout: Layout, link: Link) -> Value:
    """Stage boundaries, pipelined: ``A`` bytes over ``n`` traversals, ``m`` micro-batches, ``S`` stages:
    ``t = (m + S - 2) / m * A / (P D beta) + n (m + S - 2) alpha`` (0 for ``S = 1``). Per traversal, each
    replica's ``m`` micro-batches cross ``S - 1`` boundaries of ``A_k / (P D m)`` bytes per transfer, the
    last one ``m + S - 2`` transfers after the first starts; ``m = 1``: the boundaries one after the other;
    ``m -> inf``: one boundary's traffic."""
    if layout.boundaries == 0:
        return 0.0 * nbytes
    m = layout.micro_batches
    slots = m + layout.boundaries - 1
    return p2p_time(nbytes * slots / (layout.points * layout.dp * m), link, messages=passes * slots)


def basis_time(nbytes: Value, layout: Layout, link: Link) -> Value:
    """Basis refresh: ``t = [S > 1] * p2p(R / P, messages = 1)`` (one boundary's ``d * r`` basis)."""
    if layout.boundaries == 0:
        return 0.0 * nbytes
    return p2p_time(nbytes / layout.points, link, messages=1)


def weight_time(
    share: Value,
    layout: Layout,
    link: Link,
    params: Value | None = None,
    param_scale: float = 1.0,
    gathers: Value = 1,
    reduces: Value = 1,
) -> Value:
    """Weight update: the largest stage's share ``W_s`` of the update and ``P_s`` of the tick's updates
    sent dense (None: ``W_s``, a dense update; both at the gradients' element size) across the ``D``
    replicas (stages concurrently). ``allreduce`` (DDP): ``t = ring_allreduce(W_s, D)``. ``rs_ag`` (FSDP):
    ``t = u reduce_scatter(P_s, D) + g all_gather(c P_s, D)`` for dense gradients (``W_s = P_s``), plus
    ``ring_allreduce(W_s, D)`` for a compressed update (``W_s < P_s``: FSDP reduce-scatters the dense
    gradients all the same, and PowerSGD's factors are all-reduced on the reduced shards, as verl's engine
    runs it); ``c = param_scale``, the parameters' element size over the gradients' (``param_bytes /
    grad_bytes``), ``g = gathers`` and ``u = reduces``, the parameter all-gathers and gradient
    reduce-scatters of the tick."""
    if layout.collective == "allreduce":
        return ring_allreduce_time(share, layout.dp, link)
    params = share if params is None else params
    factors = np.where(np.asarray(share) < params, ring_allreduce_time(share, layout.dp, link), 0.0)
    reduce = reduces * reduce_scatter_time(np.asarray(params), layout.dp, link) + factors
    return reduce + gathers * all_gather_time(param_scale * np.asarray(params), layout.dp, link)


@dataclass(frozen=True)
class ChannelBytes:
    """A tick's bytes per channel as the ledger counts them (model-level; scalars or one per tick);
    ``passes``: the boundary traversals ``n`` that carry ``activations``; ``stage_weights``: the largest
    pipeline stage's share of ``weights`` (None: ``W / S``, parameters spread evenly over the stages);
    ``params``: the tick's updates sent dense, at the gradients' element size as ``weights`` (None:
    ``weights``, the update is dense); ``stage_params``: the largest stage's share of them (None:
    ``params / S``); ``param_scale``: the parameters' element size over the gradients'
    (``param_bytes / grad_bytes``): ``rs_ag`` all-gathers ``param_scale * params`` bytes of parameters."""

    activations: Value
    basis: Value
    weights: Value
    passes: Value
    stage_weights: Value | None = None
    params: Value | None = None
    stage_params: Value | None = None
    param_scale: float = 1.0

    def __post_init__(self) -> None:
        if not finite_number(self.param_scale) or self.param_scale <= 0:
            raise NetModelError(
                "bytes.param_scale",
                f"bytes.param_scale={self.param_scale!r} must be a finite number > 0: "
                "param_bytes / grad_bytes",
            )
        for field in ("activations", "basis", "weights", "passes", "stage_weights", "params", "stage_params"):
            if getattr(self, field) is None:
                continue
            values = np.asarray(getattr(self, field), dtype=np.float64)
            if not np.all(np.isfinite(values)) or np.any(values < 0):
                raise NetModelError(
                    f"bytes.{field}",
                    f"bytes.{field} must be finite and >= 0 (got {values.min() if values.size else values}); "
                    "check the ledger's comm/* metrics of the run",
                )


@dataclass(frozen=True)
class CommTime:
    """Seconds per channel (scalars or one per tick); ``total`` is their sum (channels run in turn)."""

    activations: Value
    basis: Value
    weights: Value

    @property
    def total(self) -> Value:
        return self.activations + self.basis + self.weights


def comm_time(nbytes: ChannelBytes, layout: Layout, link: Link) -> CommTime:
    """``t_comm = t_act + t_basis + t_weights`` (``activation_time``, ``basis_time``, ``weight_time`` of
    ``stage_weights``, else ``W / S``, and of ``stage_params``, else ``P / S``, else the weights', the
    all-gathers at ``param_scale``, ``layout.gathers`` of them, else ``n m``: one per traversal and
    micro-batch; the gradient reduce-scatters ``layout.reduces``, else ``m``: one per micro-batch)."""
    share = nbytes.weights / layout.stages if nbytes.stage_weights is None else nbytes.stage_weights
    params = nbytes.stage_params
    if params is None and nbytes.params is not None:
        params = nbytes.params / layout.stages
    gathers = nbytes.passes * layout.micro_batches if layout.gathers is None else layout.gathers
    reduces = layout.micro_batches if layout.reduces is None else layout.reduces
    return CommTime(
        activation_time(nbytes.activations, nbytes.passes, layout, link),
        basis_time(nbytes.basis, layout, link),
        weight_time(share, layout, link, params, nbytes.param_scale, gathers, reduces),
    )


def tick_time(train_s: Value, sample_s: Value, comm_s: Value, overlap: bool) -> Value:
    """No overlap: ``T = t_sample + t_train + t_comm``; full overlap:
    ``T = t_sample + max(t_train, t_comm)``."""
    if overlap:
        return sample_s + np.maximum(train_s, comm_s)
    return sample_s + train_s + comm_s


@dataclass(frozen=True)
class Crossover:
    """Where the method stops paying on ``[low, high]`` Gbit/s; ``gbps`` None unless ``status`` is
    ``crossover`` (``always_pays``: it still pays at ``high``; ``never_pays``: not even at ``low``)."""

    status: str
    gbps: float | None
    low: float
    high: float
    tolerance: float

    def short(self) -> str:
        """``17.4 Gbit/s``, ``> 400 Gbit/s`` or ``< 0.1 Gbit/s``."""
        if self.status == "crossover":
            return f"{self.gbps:.3g} Gbit/s"
        return f"> {self.high:g} Gbit/s" if self.status == "always_pays" else f"< {self.low:g} Gbit/s"

    def describe(self) -> str:
        share = f"{self.tolerance:.0%} of dense's tick"
        span = f"{self.low:g}-{self.high:g} Gbit/s"
        if self.status == "crossover":
            return f"{self.short()} (above it the method saves less than {share})"
        if self.status == "always_pays":
            return f"{self.short()} (the method saves at least {share} across {span})"
        return f"{self.short()} (the method saves less than {share} across {span})"


def crossover_bandwidth(
    dense_s: Callable[[float], float],
    method_s: Callable[[float], float],
    low: float,
    high: float,
    tolerance: float = 0.01,
    grid: int = 400,
) -> Crossover:
    """The bandwidth above which the method stops paying.

    The method pays at bandwidth ``B`` when ``T_method(B) < (1 - tol) T_dense(B)`` (it saves at least
    ``tol`` of dense's tick time). The crossover is ``B* = min {B in [low, high] : the method pays at no
    B' in [B, high]}``: found on a log grid of ``grid`` points, then by bisection in ``log B`` between the
    last grid point where it pays and the next one (to 1e-6 relative).
    """
    if not (0 < low < high):
        raise NetModelError("bandwidth range", f"need 0 < low < high Gbit/s (got {low!r}, {high!r})")
    if not (0 <= tolerance < 1):
        raise NetModelError("tolerance", f"tolerance={tolerance!r} must be in [0, 1); e.g. 0.01")

    def pays(gbps: float) -> bool:
        return bool(method_s(gbps) < (1 - tolerance) * dense_s(gbps))

    points = np.geomspace(low, high, grid)
    paying = np.array([pays(float(b)) for b in points])
    if paying[-1]:
        return Crossover("always_pays", None, low, high, tolerance)
    if not paying.any():
        return Crossover("never_pays", None, low, high, tolerance)
    last = int(np.nonzero(paying)[0][-1])
    lo, hi = np.log(points[last]), np.log(points[last + 1])
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if pays(float(np.exp(mid))) else (lo, mid)
    return Crossover("crossover", float(np.exp(hi)), low, high, tolerance)
