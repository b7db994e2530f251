"""The two-circuit controller: one object a training driver calls every tick (docs/design.md, "Compression").

A driver's tick::

    if ctrl.is_calibration_tick():               # anchor off: t = 0 only, before any pass through the codec
        ctrl.calibrate(dense_forward)            #   (the old / reference log-probs too): sketch for Q
    ...                                          # old / reference log-probs through the codec
    if ctrl.is_fire_tick():                      # anchor on: t = 0, K, 2K, ...
        ctrl.fire(dense_replay, codec_replay)    # stale view -> projection -> [codec replay] -> dense replay
        optimizer.step()                         #   (+ sketch), Q refresh, M update, live weights back,
    else:                                        #   p.grad = G_dense
        for j, minibatch in enumerate(minibatches):
            optimizer.zero_grad()
            with ctrl.compressed(microbatch_id=j, token_mask=mask):
                loss.backward()
            ctrl.compress_gradients()            # PowerSGD (+ error feedback) then sign correction
            if ctrl.is_update_tick():            # method.fast_step=false: fast ticks take no step
                optimizer.step()
    metrics |= ctrl.end_tick()                   # every metric of the tick (comm/*, anchor/*, codec/*,
                                                 #   sign_memory/*); tick += 1

Parameters may be FSDP2 ``DTensor``s: every per-parameter state (memory, error feedback, snapshots) is
kept for the local shard; ``process_group`` (default: the parameters' mesh group) sums the sketches
across data-parallel ranks and the PowerSGD factors across row shards. ``state_dict`` holds this rank's
shards.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from commrl.compression.activation import (
    ActivationCodec,
    BasisRefresh,
    IdentityCodec,
    LowRankActivationCodec,
    PRFMaskActivationCodec,
    lowrank_project,
)
from commrl.compression.config import MethodConfig, compression_layers
from commrl.compression.diagnostics import RankSums, cosine, cosine_terms, squared_norm
from commrl.compression.hooks import CompressionPoints, decoder_layers
from commrl.compression.ledger import ByteLedger
from commrl.compression.powersgd import PowerSGD, all_reduce_many, local_tensor, shard_group
from commrl.compression.projection import (
    SnapshotBuffer,
    progressive_scale,
    project_tensor,
    relex_gram,
    snapshots_needed,
)
from commrl.compression.sign_memory import DenseMemory, sign_agreement, sign_correct, sign_correct_

SAMPLER_STREAM = 2**31 - 1  # PRF micro-batch id reserved for the sampler's own masks


def build_codec(cfg: MethodConfig, hidden: int, num_points: int) -> ActivationCodec:
    """The activation codec named by ``cfg.codec``."""
    if cfg.codec == "lowrank":
        return LowRankActivationCodec(hidden, cfg.rank, num_points, cfg.seed)
    if cfg.codec == "prf_mask":
        return PRFMaskActivationCodec(cfg.keep_prob(hidden), cfg.seed)
    return IdentityCodec()


class TwoCircuitController:
    """Owns the compression points, bases, PowerSGD state, dense memory, snapshots, ledger and tick.

    Every metric a tick produces (the fire's, the calibration's, the fast steps' sign agreement, the
    ledger's bytes) is collected here and returned by ``end_tick``.
    """

    def __init__(
        self,
        model: nn.Module,
        cfg: MethodConfig,
        process_group: dist.ProcessGroup | None = None,
        snapshot_device: torch.device | str = "cpu",
    ) -> None:
        self.num_layers = len(decoder_layers(model))
        self.hidden = int(model.config.hidden_size)
        self.cfg = cfg.validate(self.hidden)
        self.layer_ids = compression_layers(self.num_layers, cfg.points)
        self.model = model
        self.params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        self._sharded = {name: shard_group(p) is not None for name, p in self.params.items()}
        mesh_groups = [shard_group(p) for p in self.params.values() if isinstance(p, DTensor)]
        self.process_group = (
            process_group
            if process_group is not None
            else next((g for g in mesh_groups if g is not None), None)
        )
        self.codec = build_codec(cfg, self.hidden, len(self.layer_ids))
        self.ledger = ByteLedger()
        self.points = CompressionPoints(model, self.codec, self.ledger, self.layer_ids)
        self.attached: list[CompressionPoints] = []
        self.powersgd = (
            PowerSGD(cfg.effective_grad_rank(), cfg.min_compression_rate, cfg.seed)
            if cfg.grad_codec == "powersgd"
            else None
        )
        self.sign_scope = self._sign_scope()
        self.memory = DenseMemory(cfg.beta)
        self.snapshots = SnapshotBuffer(snapshot_device)
        self._tick = 0
        self._secant_fires = 0
        self._fired_this_tick = False
        self._calibrated_this_tick = False
        self._counting = True
        self._tick_metrics: dict[str, float] = {}
        self._agreement = RankSums()

    def _sign_scope(self) -> frozenset[str]:
        """The parameters the sign correction re-signs (and the dense memory keeps), by ``sign_scope``:
        ``all`` every trainable parameter, ``compressed`` those PowerSGD compresses (full shapes)."""
        if self.cfg.sign_scope == "all":
            return frozenset(self.params)
        assert self.powersgd is not None, "validate(): sign_scope=compressed needs grad_codec=powersgd"
        return frozenset(name for name, p in self.params.items() if self.powersgd.compresses(tuple(p.shape)))

    @property
    def tick(self) -> int:
        return self._tick

    def is_fire_tick(self) -> bool:
        """Anchor on: ``t = 0, K, 2K, ...`` (method.md §3)."""
        return self.cfg.fires_at(self._tick)

    def is_calibration_tick(self) -> bool:
        """Anchor off, ``t = 0``, a codec with a basis to calibrate (``lowrank``), not yet calibrated.

        A driver calibrates before the tick's first pass through the codec (the old-log-prob pass), so
        that every pass of tick 0 uses the calibrated basis.
        """
        return self.cfg.calibration_due(self._tick) and not self._calibrated_this_tick

    def is_update_tick(self) -> bool:
        """Whether this tick's gradients go to the optimizer: a fire tick, or a fast tick when
        ``method.fast_step`` (false: the anchor-only control, fast ticks take no optimizer step at all)."""
        return self.cfg.fast_step or self.is_fire_tick()

    def compression_points(self, module: nn.Module) -> CompressionPoints:
        """Compression points on ``module`` at the controller's layers, with its codec and ledger."""
        if int(module.config.hidden_size) != self.hidden or len(decoder_layers(module)) != self.num_layers:
            raise ValueError(
                "compression points of this controller need a model with hidden size "
                f"{self.hidden} and {self.num_layers} decoder layers"
            )
        return CompressionPoints(module, self.codec, self.ledger, self.layer_ids)

    def attach(self, module: nn.Module) -> None:
        """Put the same compression points (same codec, bases and ledger) on another model of the same
        shape, e.g. the frozen reference policy, whose forward then goes through the actor's codec
        (method.md §1.5, ``kl_ref_forward: codec``). ``compressed()`` and ``dense()`` cover it too."""
        self.attached.append(self.compression_points(module))

    @contextmanager
    def _session(
        self, mode: str, microbatch: int, token_mask: Tensor | None, counted: bool = True
    ) -> Iterator[None]:
        count = self._counting and counted
        with ExitStack() as stack:
            for points in (self.points, *self.attached):
                stack.enter_context(points.session(mode, self._tick, microbatch, token_mask, count))
            yield

    @contextmanager
    def compressed(
        self, microbatch_id: int = 0, token_mask: Tensor | None = None, counted: bool = True
    ) -> Iterator[None]:
        """Forward (and backward) through the activation codec; same ``microbatch_id`` => same PRF mask.
        ``counted=False``: a read-out pass no deployment would run, left out of the ledger."""
        with self._session("compressed", microbatch_id, token_mask, counted):
            yield

    @contextmanager
    def dense(self, token_mask: Tensor | None = None) -> Iterator[None]:
        """An uncompressed forward (counted as dense bytes)."""
        with self._session("dense", 0, token_mask):
            yield

    def sampler_codec_fn(self) -> Callable[[int, Tensor], Tensor] | None:
        """The codec as a sampler applies it to one layer's residual stream ``A`` (``[tokens, d]``), with
        the current bases; None for the identity codec. Layers without a compression point (the last one
        under ``points: boundaries``) pass unchanged. For ``prf_mask`` the sampler's masks come from their
        own key stream (``microbatch = SAMPLER_STREAM``): unbiased, but not the trainer's draws."""
        codec = self.codec
        point_of = {layer: point for point, layer in enumerate(self.layer_ids)}
        if isinstance(codec, LowRankActivationCodec):
            bases = [Q.detach().clone() for Q in codec.bases]

            def lowrank(layer: int, A: Tensor) -> Tensor:
                if layer not in point_of:
                    return A
                return lowrank_project(A, bases[point_of[layer]].to(device=A.device, dtype=A.dtype))

            return lowrank
        if isinstance(codec, PRFMaskActivationCodec):
            tick = self._tick

            def masked(layer: int, A: Tensor) -> Tensor:
                if layer not in point_of:
                    return A
                return codec.apply(A, point_of[layer], tick, SAMPLER_STREAM)

            return masked
        return None

    def _grads(self) -> dict[str, Tensor]:
        return {name: p.grad for name, p in self.params.items() if p.grad is not None}

    @torch.no_grad()
    def compress_gradients(self) -> None:
        """Fast circuit on ``p.grad``: PowerSGD with error feedback, then the sign correction (§2).

        Once a memory exists, also counts ``sign_agreement(G_corr, sign(M))`` over the sign scope for the
        tick's ``sign_memory/agreement`` (also with ``alpha = 1``, where ``G_corr`` is ``G_hat``).
        """
        if self._fired_this_tick:
            raise RuntimeError(
                f"compress_gradients() at tick {self._tick}, a fire tick: the fire's dense update travels "
                "as it is"
            )
        grads = self._grads()
        if self.powersgd is not None:
            wire = self.powersgd.compress_(grads, self.process_group)
            self.ledger.add("weights", wire.actual, wire.dense)
        else:
            dense = _dense_bytes(grads)
            self.ledger.add("weights", dense, dense)
        if not self.memory:
            return
        for name, grad in grads.items():
            if name not in self.memory:
                continue
            local, M = local_tensor(grad), self.memory[name]
            sign_M = torch.sign(M)  # one pass, read by the correction and the agreement
            if self.cfg.alpha < 1.0:
                sign_correct_(local, M, self.cfg.alpha, sign_M)
            self._agreement.add(sign_agreement(local, sign_M), self._sharded[name])

    @torch.no_grad()
    def fire(self, dense_replay: Callable[[], Any], codec_replay: Callable[[], Any] | None = None) -> None:
        """The anchor circuit (method.md §3) at a fire tick; leaves ``p.grad = G_dense`` for the optimizer.

        Snapshot the live weights; load the projection of the stale view; when the diagnostic is due
        (``method.grad_cosine_every``, ``MethodConfig.grad_cosine_due``), run ``codec_replay()`` (the driver
        zeroes the grads and runs the replay's forward+backward with every micro-batch inside
        ``compressed(j, mask)``, as a fast tick would) for the gradient cosines; run
        ``dense_replay()`` (the driver zeroes the grads, runs the dense forward+backward) while sketching;
        ``Q <- orth(S)``; ``M`` update; live weights back. Its metrics come with ``end_tick()``.
        """
        if not self.is_fire_tick():
            raise RuntimeError(
                f"fire() at tick {self._tick}: the anchor fires at multiples of {self.cfg.cadence}"
            )
        t, delay = self._tick, self.cfg.effective_delay()
        cosine_due = self.cfg.grad_cosine_due(t)
        if cosine_due and codec_replay is None:
            raise ValueError(
                f"fire() at tick {t} needs codec_replay (the replay through the codec) for "
                "anchor/grad_cosine_*; pass it, or set method.grad_cosine_every=0"
            )
        live = {name: local_tensor(p) for name, p in self.params.items()}
        self.snapshots.add(t, live)
        needed = snapshots_needed(self.cfg.projection, self.cfg.relex_window)
        window = self.snapshots.visible(t, delay)[-needed:]
        scale = self._scale(len(window) >= 2)
        try:
            distance = self._load_projection(window, t, scale) if window else 0.0
            codec_grads = (
                self._codec_gradients(codec_replay) if cosine_due and codec_replay is not None else None
            )
            if isinstance(self.codec, LowRankActivationCodec):
                self.codec.begin_sketch()
            with self.ledger.anchor():
                with torch.enable_grad(), self.points.session("sketch", t):
                    dense_replay()
                grads = self._grads()
                dense = _dense_bytes(grads)
                self.ledger.add("weights", dense, dense)
                refresh = self._refresh_bases()
            if codec_grads is not None:
                self._tick_metrics.update(self._grad_cosines(codec_grads, grads))
            self.memory.update(
                {name: local_tensor(g) for name, g in grads.items() if name in self.sign_scope}
            )
        finally:  # live weights back, also when the replay fails
            for name, theta in self.snapshots[t].items():
                live[name].copy_(theta)
        self.snapshots.prune(t, delay, needed)
        self._fired_this_tick = True
        self._tick_metrics.update(
            {
                "anchor/visible_snapshots": float(len(window)),
                "anchor/projection_scale": scale,
                "anchor/projection_distance": distance,
                **_refresh_metrics(refresh),
            }
        )

    def _codec_gradients(self, codec_replay: Callable[[], Any]) -> dict[str, Tensor]:
        """``G_codec``: the replay's gradient through the activation codec at ``theta_proj``, with the
        bases in use (before this fire's refresh); uncounted, and taken out of ``p.grad``."""
        self._counting = False
        try:
            with torch.enable_grad():
                codec_replay()
        finally:
            self._counting = True
        grads = self._grads()
        for p in self.params.values():
            p.grad = None
        return grads

    def _grad_cosines(
        self, codec_grads: dict[str, Tensor], dense_grads: dict[str, Tensor]
    ) -> dict[str, float]:
        """``anchor/grad_cosine_raw = cos(G_hat, G_dense)`` and ``anchor/grad_cosine_corrected =
        cos(G_corr, G_dense)``, each over all parameters at once (method.md §4).

        ``G_hat`` is ``G_codec`` through the weight codec as the fast circuit would send it at this tick
        (PowerSGD on a copy of the error feedback and warm-start state, which stay untouched), ``G_corr`` its
        sign correction with the memory before this fire's update (``G_hat`` itself before the first fire
        or with ``alpha = 1``).
        """
        if self.powersgd is not None:
            copy.deepcopy(self.powersgd).compress_(codec_grads, self.process_group)
        raw, corrected = RankSums(), RankSums()
        correct = bool(self.memory) and self.cfg.alpha < 1.0
        for name, g_hat in codec_grads.items():
            if name not in dense_grads:
                continue
            local, dense, sharded = local_tensor(g_hat), local_tensor(dense_grads[name]), self._sharded[name]
            terms = cosine_terms(local, dense)
            raw.add(terms, sharded)
            if correct and name in self.memory:
                terms = cosine_terms(sign_correct(local, self.memory[name], self.cfg.alpha), dense)
            corrected.add(terms, sharded)
        raw_total, corrected_total = raw.total(self.process_group), corrected.total(self.process_group)
        return {
            "anchor/grad_cosine_raw": cosine(raw_total) if raw_total is not None else 0.0,
            "anchor/grad_cosine_corrected": cosine(corrected_total) if corrected_total is not None else 0.0,
        }

    def _scale(self, has_secant: bool) -> float:
        if self.cfg.projection != "progressive" or not has_secant:
            return float(self.cfg.projection_scale)
        scale = progressive_scale(self.cfg.projection_scale, self._secant_fires, self.cfg.progressive_fires)
        self._secant_fires += 1
        return scale

    def _load_projection(self, window: list[int], t_now: int, scale: float) -> float:
        """Write ``theta_proj`` into the parameters; return ``||theta_proj - theta|| / ||theta||`` (live)."""
        grams = {}
        if self.cfg.projection == "relex" and len(window) >= self.cfg.relex_window:
            device = local_tensor(next(iter(self.params.values()))).device  # where the collectives run
            grams = {
                name: relex_gram([self.snapshots[tau][name] for tau in window]).to(device)
                for name in self.params
            }
            sharded = [name for name, p in self.params.items() if shard_group(p) is not None]
            if sharded:
                all_reduce_many([grams[name] for name in sharded], self.process_group)
        moved, norms = [], []
        for name, p in self.params.items():
            target = local_tensor(p)
            thetas = [self.snapshots[tau][name].to(target.device) for tau in window]
            theta = project_tensor(
                self.cfg.projection, thetas, window, t_now, scale, self.cfg.relex_window, grams.get(name)
            )
            moved.append(torch.linalg.vector_norm(theta - target, dtype=torch.float64).square())
            norms.append(torch.linalg.vector_norm(target, dtype=torch.float64).square())
            target.copy_(theta)
        sq = torch.stack([torch.stack(moved).sum(), torch.stack(norms).sum()])
        if self.process_group is not None and any(shard_group(p) is not None for p in self.params.values()):
            dist.all_reduce(sq, group=self.process_group)
        return float(sq[0].sqrt() / sq[1].sqrt().clamp_min(1e-30))

    def _refresh_bases(self) -> BasisRefresh | None:
        """``Q <- orth(S)`` at every point, sketches summed over ranks; bytes ``d * r`` per point.

        None for a codec without bases.
        """
        if not isinstance(self.codec, LowRankActivationCodec):
            return None
        reduce = None
        if self.process_group is not None:
            group = self.process_group

            def reduce(t: Tensor) -> None:
                dist.all_reduce(t, group=group)

        refresh = self.codec.refresh(reduce)
        basis_bytes = float(
            len(self.points) * self.hidden * self.cfg.rank * self.points.activation_element_size
        )
        self.ledger.add("basis_refresh", basis_bytes, 0.0)
        return refresh

    @torch.no_grad()
    def calibrate(self, dense_forward: Callable[[], Any]) -> None:
        """Anchor off, t = 0: a dense forward that only sketches, then ``Q <- orth(S)``; no M, no update.

        Once per run, before the tick's first pass through the codec; its metrics come with ``end_tick()``.
        """
        if not self.is_calibration_tick():
            raise RuntimeError(
                f"calibrate() at tick {self._tick}: only once, at t = 0, with the anchor off and codec "
                "lowrank"
            )
        self.codec.begin_sketch()
        with self.points.session("sketch", self._tick):
            dense_forward()
        self._tick_metrics.update(_refresh_metrics(self._refresh_bases()))
        self._calibrated_this_tick = True

    @torch.no_grad()
    def grad_norm(self) -> float:
        """``||g||_2`` over every parameter's ``p.grad`` (row shards summed over ranks; all ranks call it)."""
        sums = RankSums()
        for name, grad in self._grads().items():
            sums.add(squared_norm(local_tensor(grad)), self._sharded[name])
        total = sums.total(self.process_group)
        return float(total.sqrt()) if total is not None else 0.0

    def end_tick(self) -> dict[str, float]:
        """Every metric of the tick, from one call; advances the tick (every rank calls it).

        ``comm/*`` (the ledger), ``anchor/fire``; on a fire tick ``anchor/visible_snapshots``,
        ``anchor/projection_scale``, ``anchor/projection_distance``, ``anchor/basis_overlap``, when due
        (``method.grad_cosine_every``) ``anchor/grad_cosine_raw`` and ``anchor/grad_cosine_corrected``,
        and, for ``lowrank``, ``codec/energy_captured`` (mean over points) and
        ``codec/energy_captured/layer<i>``; on the calibration tick the basis overlap and energies; on a
        fast tick with a memory ``sign_memory/agreement`` (absent when no element has both ``G_corr`` and
        ``M`` non-zero).
        """
        metrics = dict(self._tick_metrics)
        agreement = self._agreement.total(self.process_group)
        if agreement is not None and agreement[1] > 0:  # none when no element has G_corr and M non-zero
            agree, total = agreement.tolist()
            metrics["sign_memory/agreement"] = agree / total
        metrics.update(self.ledger.end_tick())
        metrics["anchor/fire"] = float(self._fired_this_tick)
        self._tick += 1
        self._fired_this_tick = self._calibrated_this_tick = False
        self._tick_metrics = {}
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """Everything a bit-identical resume needs (this rank's shards); save it with ``torch.save``."""
        return {
            "config": self.cfg.to_dict(),
            "tick": self._tick,
            "secant_fires": self._secant_fires,
            "codec": self.codec.state_dict() if isinstance(self.codec, LowRankActivationCodec) else {},
            "powersgd": self.powersgd.state_dict() if self.powersgd is not None else {},
            "memory": self.memory.state_dict(),
            "snapshots": self.snapshots.state_dict(),
            "ledger": self.ledger.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None) -> None:
        """The state of ``state_dict``; the per-parameter buffers (PowerSGD's error and Q, the memory) go
        to ``device``, else to each parameter's device (an engine whose parameters sit offloaded on the CPU
        while it loads gives the device they train on)."""
        saved = MethodConfig.from_dict(state["config"])
        if saved != self.cfg:
            diff = {
                k: (v, getattr(self.cfg, k)) for k, v in saved.to_dict().items() if getattr(self.cfg, k) != v
            }
            raise ValueError(f"saved controller state has different method settings (saved, now): {diff}")
        if self._fired_this_tick:
            raise RuntimeError("load_state_dict() in the middle of a tick; load before the tick starts")
        self._tick, self._secant_fires = int(state["tick"]), int(state["secant_fires"])
        if isinstance(self.codec, LowRankActivationCodec):
            self.codec.load_state_dict(state["codec"])
        devices = {name: device or local_tensor(p).device for name, p in self.params.items()}
        if self.powersgd is not None:
            psgd = state["powersgd"]
            self.powersgd.load_state_dict(
                {
                    "error": {k: v.to(devices[k]) for k, v in psgd["error"].items()},
                    "q": {k: v.to(devices[k]) for k, v in psgd["q"].items()},
                    "rng": psgd["rng"],
                }
            )
        self.memory.load_state_dict({k: v.to(devices[k]) for k, v in state["memory"].items()})
        self.snapshots.load_state_dict(state["snapshots"])
        self.ledger.load_state_dict(state["ledger"])

    def remove(self) -> None:
        """Detach the hooks from the model (and from attached models)."""
        for points in (self.points, *self.attached):
            points.remove()


def _dense_bytes(grads: dict[str, Tensor]) -> float:
    return float(sum(g.numel() * local_tensor(g).element_size() for g in grads.values()))


def _refresh_metrics(refresh: BasisRefresh | None) -> dict[str, float]:
    """``anchor/basis_overlap`` (1.0 for a codec without bases) and, with bases, ``codec/energy_captured``
    (mean over the points) and ``codec/energy_captured/layer<i>`` per compression point."""
    if refresh is None:
        return {"anchor/basis_overlap": 1.0}
    metrics = {"anchor/basis_overlap": refresh.mean_overlap, "codec/energy_captured": refresh.mean_energy}
    metrics.update({f"codec/energy_captured/layer{i}": e for i, e in enumerate(refresh.energy)})
    return metrics
