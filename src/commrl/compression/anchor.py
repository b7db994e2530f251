"""The two-circuit controller: one object a training driver calls every tick (docs/design.md, "Compression").

A driver's tick::

    if ctrl.is_fire_tick():                      # anchor on: t = 0, K, 2K, ...
        metrics = ctrl.fire(dense_replay)        # stale view -> projection -> dense replay (+ sketch)
        optimizer.step()                         #   Q refresh, M update, live weights back, p.grad = G_dense
    else:
        if ctrl.is_calibration_tick():           # anchor off: t = 0 only, sketch for Q, no update
            ctrl.calibrate(dense_forward)
        for j, minibatch in enumerate(minibatches):
            optimizer.zero_grad()
            with ctrl.compressed(microbatch_id=j, token_mask=mask):
                loss.backward()
            ctrl.compress_gradients()            # PowerSGD (+ error feedback) then sign correction
            optimizer.step()
    metrics |= ctrl.end_tick()                   # comm/* for this tick; tick += 1

Parameters may be FSDP2 ``DTensor``s: every per-parameter state (memory, error feedback, snapshots) is
kept for the local shard; ``process_group`` (default: the parameters' mesh group) sums the sketches
across data-parallel ranks and the PowerSGD factors across row shards. ``state_dict`` holds this rank's
shards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from commrl.compression.activation import (
    ActivationCodec,
    IdentityCodec,
    LowRankActivationCodec,
    PRFMaskActivationCodec,
    lowrank_project,
)
from commrl.compression.config import MethodConfig
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
from commrl.compression.sign_memory import DenseMemory, sign_correct_

SAMPLER_STREAM = 2**31 - 1  # PRF micro-batch id reserved for the sampler's own masks


def build_codec(cfg: MethodConfig, hidden: int, num_points: int) -> ActivationCodec:
    """The activation codec named by ``cfg.codec``."""
    if cfg.codec == "lowrank":
        return LowRankActivationCodec(hidden, cfg.rank, num_points, cfg.seed)
    if cfg.codec == "prf_mask":
        return PRFMaskActivationCodec(cfg.keep_prob(hidden), cfg.seed)
    return IdentityCodec()


class TwoCircuitController:
    """Owns the compression points, bases, PowerSGD state, dense memory, snapshots, ledger and tick."""

    def __init__(
        self,
        model: nn.Module,
        cfg: MethodConfig,
        process_group: dist.ProcessGroup | None = None,
        snapshot_device: torch.device | str = "cpu",
    ) -> None:
        layers = decoder_layers(model)
        self.hidden = int(model.config.hidden_size)
        self.cfg = cfg.validate(self.hidden)
        self.model = model
        self.params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        mesh_groups = [shard_group(p) for p in self.params.values() if isinstance(p, DTensor)]
        self.process_group = (
            process_group
            if process_group is not None
            else next((g for g in mesh_groups if g is not None), None)
        )
        self.codec = build_codec(cfg, self.hidden, len(layers))
        self.ledger = ByteLedger()
        self.points = CompressionPoints(model, self.codec, self.ledger)
        self.attached: list[CompressionPoints] = []
        self.powersgd = (
            PowerSGD(cfg.effective_grad_rank(), cfg.min_compression_rate, cfg.seed)
            if cfg.grad_codec == "powersgd"
            else None
        )
        self.memory = DenseMemory(cfg.beta)
        self.snapshots = SnapshotBuffer(snapshot_device)
        self._tick = 0
        self._secant_fires = 0
        self._fired_this_tick = False

    @property
    def tick(self) -> int:
        return self._tick

    def is_fire_tick(self) -> bool:
        """Anchor on: ``t = 0, K, 2K, ...`` (method.md §3)."""
        return self.cfg.anchor and self._tick % self.cfg.cadence == 0

    def is_calibration_tick(self) -> bool:
        """Anchor off, ``t = 0``, and a codec with a basis to calibrate (``lowrank``)."""
        return not self.cfg.anchor and self._tick == 0 and isinstance(self.codec, LowRankActivationCodec)

    def attach(self, module: nn.Module) -> None:
        """Put the same compression points (same codec, bases and ledger) on another model of the same
        shape, e.g. the frozen reference policy, whose forward then goes through the actor's codec
        (method.md §1.5, ``kl_ref_forward: codec``). ``compressed()`` and ``dense()`` cover it too."""
        if int(module.config.hidden_size) != self.hidden or len(decoder_layers(module)) != len(self.points):
            raise ValueError("attach() needs a model with the controller's hidden size and number of layers")
        self.attached.append(CompressionPoints(module, self.codec, self.ledger))

    @contextmanager
    def _session(self, mode: str, microbatch: int, token_mask: Tensor | None) -> Iterator[None]:
        with ExitStack() as stack:
            for points in (self.points, *self.attached):
                stack.enter_context(points.session(mode, self._tick, microbatch, token_mask))
            yield

    @contextmanager
    def compressed(self, microbatch_id: int = 0, token_mask: Tensor | None = None) -> Iterator[None]:
        """Forward (and backward) through the activation codec; same ``microbatch_id`` => same PRF mask."""
        with self._session("compressed", microbatch_id, token_mask):
            yield

    @contextmanager
    def dense(self, token_mask: Tensor | None = None) -> Iterator[None]:
        """An uncompressed forward (counted as dense bytes)."""
        with self._session("dense", 0, token_mask):
            yield

    def sampler_codec_fn(self) -> Callable[[int, Tensor], Tensor] | None:
        """The codec as a sampler applies it to one layer's residual stream ``A`` (``[tokens, d]``), with
        the current bases; None for the identity codec. For ``prf_mask`` the sampler's masks come from
        their own key stream (``microbatch = SAMPLER_STREAM``): unbiased, but not the trainer's draws."""
        codec = self.codec
        if isinstance(codec, LowRankActivationCodec):
            bases = [Q.detach().clone() for Q in codec.bases]
            return lambda point, A: lowrank_project(A, bases[point].to(device=A.device, dtype=A.dtype))
        if isinstance(codec, PRFMaskActivationCodec):
            tick = self._tick
            return lambda point, A: codec.apply(A, point, tick, SAMPLER_STREAM)
        return None

    def _grads(self) -> dict[str, Tensor]:
        return {name: p.grad for name, p in self.params.items() if p.grad is not None}

    @torch.no_grad()
    def compress_gradients(self) -> None:
        """Fast circuit on ``p.grad``: PowerSGD with error feedback, then the sign correction (§2)."""
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
        if self.memory and self.cfg.alpha < 1.0:
            for name, grad in grads.items():
                if name in self.memory:
                    sign_correct_(local_tensor(grad), self.memory[name], self.cfg.alpha)

    @torch.no_grad()
    def fire(self, dense_replay: Callable[[], Any]) -> dict[str, float]:
        """The anchor circuit (method.md §3) at a fire tick; leaves ``p.grad = G_dense`` for the optimizer.

        Snapshot the live weights; load the projection of the stale view; run ``dense_replay()`` (the
        driver zeroes the grads, runs the dense forward+backward) while sketching; ``Q <- orth(S)``;
        ``M`` update; live weights back.
        """
        if not self.is_fire_tick():
            raise RuntimeError(
                f"fire() at tick {self._tick}: the anchor fires at multiples of {self.cfg.cadence}"
            )
        t, delay = self._tick, self.cfg.effective_delay()
        live = {name: local_tensor(p) for name, p in self.params.items()}
        self.snapshots.add(t, live)
        needed = snapshots_needed(self.cfg.projection, self.cfg.relex_window)
        window = self.snapshots.visible(t, delay)[-needed:]
        scale = self._scale(len(window) >= 2)
        try:
            distance = self._load_projection(window, t, scale) if window else 0.0
            if isinstance(self.codec, LowRankActivationCodec):
                self.codec.begin_sketch()
            with self.ledger.anchor():
                with torch.enable_grad(), self.points.session("sketch", t):
                    dense_replay()
                grads = self._grads()
                dense = _dense_bytes(grads)
                self.ledger.add("weights", dense, dense)
                overlap = self._refresh_bases()
            self.memory.update({name: local_tensor(g) for name, g in grads.items()})
        finally:  # live weights back, also when the replay fails
            for name, theta in self.snapshots[t].items():
                live[name].copy_(theta)
        self.snapshots.prune(t, delay, needed)
        self._fired_this_tick = True
        return {
            "anchor/fire": 1.0,
            "anchor/visible_snapshots": float(len(window)),
            "anchor/projection_scale": scale,
            "anchor/projection_distance": distance,
            "anchor/basis_overlap": overlap,
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

    def _refresh_bases(self) -> float:
        """``Q <- orth(S)`` at every point, sketches summed over ranks; bytes ``d * r`` per point."""
        if not isinstance(self.codec, LowRankActivationCodec):
            return 1.0
        reduce = None
        if self.process_group is not None:
            group = self.process_group

            def reduce(t: Tensor) -> None:
                dist.all_reduce(t, group=group)

        overlap = self.codec.refresh(reduce)
        basis_bytes = float(
            len(self.points) * self.hidden * self.cfg.rank * self.points.activation_element_size
        )
        self.ledger.add("basis_refresh", basis_bytes, 0.0)
        return overlap

    @torch.no_grad()
    def calibrate(self, dense_forward: Callable[[], Any]) -> dict[str, float]:
        """Anchor off, t = 0: a dense forward that only sketches, then ``Q <- orth(S)``; no M, no update."""
        if not self.is_calibration_tick():
            raise RuntimeError(
                f"calibrate() at tick {self._tick}: only at t = 0 with the anchor off and codec lowrank"
            )
        self.codec.begin_sketch()
        with self.points.session("sketch", self._tick):
            dense_forward()
        return {"anchor/basis_overlap": self._refresh_bases()}

    def end_tick(self) -> dict[str, float]:
        """The tick's ``comm/*`` metrics (and ``anchor/fire``); advances the tick."""
        metrics = self.ledger.end_tick()
        metrics["anchor/fire"] = float(self._fired_this_tick)
        self._tick += 1
        self._fired_this_tick = False
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

    def load_state_dict(self, state: dict[str, Any]) -> None:
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
        devices = {name: local_tensor(p).device for name, p in self.params.items()}
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
