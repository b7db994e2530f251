"""The two circuits inside verl 0.9.1's model engine (``FSDPEngineWithLMHead``, docs/design.md "Compression").

``TwoCircuitEngineMixin`` goes in front of an ``FSDPEngineWithLMHead`` (the stock FSDP engine on GPUs; the
tests' plain CPU engine) and owns a ``TwoCircuitController`` built from ``COMMRL_METHOD``. Without that
variable the engine is the stock engine. One verl trainer step is one tick (method.md §1):

- every forward of the actor goes through the activation codec: the old-log-prob pass (``infer_batch``)
  and the training passes, micro-batch ``j`` with PRF key ``j`` (the passes share one micro-batch
  partition when their token budgets agree, as in configs/verl/), the token mask of padded inputs; a fire
  tick's extra old-log-prob pass, flagged ``OLD_PASS`` by the trainer, is ``dense`` (``controller.dense``,
  counted: decoupled mode's anchor correction) or ``readout`` (through the codec, uncounted: bypass mode's
  read-outs), as the local driver's passes of those modes;
- the reference model (``engine_config.forward_only``) goes through the same codec -- the actor's bases and
  masks, found in this process -- when ``kl_ref_forward == "codec"``, else stays dense; a pass flagged
  ``DENSE_REFERENCE`` stays dense too: on a fire tick the trainer adds those log-probs (``DENSE_REF_KEY``),
  and the tick's updates (the replays, later dense mini-batches) take their KL term against them;
- a tick's first mini-batch on a fire tick runs ``controller.fire(dense_replay, codec_replay)``: the replay
  re-runs ``forward_backward_batch`` with the codec in sketch mode and the GRPO loss at ratio one (old
  log-probs := the replay's own detached log-probs), then the optimizer applies ``G_dense``; on the fires
  ``method.grad_cosine_every`` selects, the same replay first runs through the codec (uncounted) for
  ``anchor/grad_cosine_*``. Further mini-batches of a fire tick (only when ``ppo_mini_batch_size`` < the
  batch) train dense. Other ticks: compressed passes, ``compress_gradients()`` (PowerSGD on FSDP2's
  ``DTensor`` shards, sign correction), the optimizer step;
- the tick ends on the mini-batch that carries ``update_lr_scheduler`` (the trainer step's last):
  ``controller.end_tick()``; all of the tick's controller metrics (``comm/*``, ``anchor/*``, ``codec/*``,
  ``sign_memory/*``) are returned as one-element lists (verl logs them as ``actor/comm/...``;
  ``commrl.verl_ext.trainer`` renames them);
- with the anchor off, tick 0's first old-log-prob pass (``infer_batch``) first calibrates ``Q``;
  with ``method.fast_step=false`` the fast ticks' mini-batches take no optimizer step;
- the controller's state is saved and loaded with verl's checkpoints (``commrl_controller_rank<r>.pt``).
- the loss is verl's own (``verl.workers.utils.losses.ppo_loss``, the worker's ``loss_function``): fast
  ticks take verl's rollout correction as verl computed it (decoupled mode: ``rollout_is_weights`` and the
  rejection-masked ``response_mask`` of the compressed old pass; bypass mode: the ``bypass_mode`` policy
  loss). The replay's ``ratio_one`` replaces ``old_log_probs``, which in bypass mode are also the bypass
  loss's behaviour log-probs, so there the replay is the uncorrected ratio-one update (``rho = 1``); in
  decoupled mode ``anchor_replay_data`` gives it the dense old pass's correction (``ANCHOR_*_KEY``, set by the
  trainer): its mask (also ``loss_mask``, verl's token count), its weights, the advantages before rejection;
  ``counting_effective_tokens`` adds, per micro-batch, the tokens whose policy-gradient loss has a nonzero
  gradient w.r.t. their log-prob among the eligible ones the trainer marks (``ELIGIBLE_KEY``), for
  ``actor/effective_token_frac``.
- with the anchor on, FSDP2 must reshard every group after its forward (``reshard_after_forward``, verl's
  default): the fire loads its view into the shards, which only a resharded group gathers again.

A micro-batch's compression session stays open through its backward, so that a layer re-run by gradient
checkpointing goes through the same codec (same basis, same mask); ``EngineByteLedger`` counts its bytes
once and sums every data-parallel rank's activation bytes at the end of a tick.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from verl.utils import tensordict_utils as tu
from verl.utils.device import get_device_id, get_device_name
from verl.utils.metric import AggregationType, Metric
from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import build_attention_mask_from_nested, no_padding_2_padding

from commrl.compression import CompressionPoints, MethodConfig, TwoCircuitController
from commrl.compression.ledger import ByteLedger
from commrl.compression.powersgd import local_tensor
from commrl.errors import ConfigError
from commrl.rl.health import NonFiniteLossError
from commrl.verl_ext.config import layout_error, method_from_env

ACTIVATION_CHANNELS = ("activations_forward", "activations_backward")
# (batch, response) mask of the tokens eligible for gradient (valid before rejection, nonzero advantage),
# set by commrl.verl_ext.trainer.CommrlPPOTrainer._update_actor
ELIGIBLE_KEY = "commrl_eligible_mask"
EFFECTIVE_TOKENS, ELIGIBLE_TOKENS = "actor/effective_tokens", "actor/eligible_tokens"
# A fire tick's reference log-probs without the codec (``MethodConfig.dense_reference_due``): the trainer asks
# the reference engine for them with the non-tensor flag DENSE_REFERENCE and adds them to the batch as
# DENSE_REF_KEY; the anchor's updates use them in place of the batch's ``ref_log_prob`` (the codec's).
DENSE_REFERENCE = "commrl_dense_reference"
DENSE_REF_KEY = "commrl_ref_log_prob_dense"
# A fire tick's extra old-log-prob pass of the actor, asked by the trainer with the non-tensor entry OLD_PASS:
# "dense" (no codec, counted as dense traffic: the anchor's rollout correction in decoupled mode) or
# "readout" (through the codec, uncounted: the tick's read-outs in bypass mode).
OLD_PASS = "commrl_old_pass"
OLD_PASSES = ("dense", "readout")
# The anchor replay's loss inputs in decoupled mode (the dense pass's correction, set by the trainer): the
# rejection mask, the IS weights (absent when rollout_is is off) and the advantages before any rejection.
ANCHOR_MASK_KEY = "commrl_anchor_response_mask"
ANCHOR_IS_KEY = "commrl_anchor_is_weights"
ANCHOR_ADV_KEY = "commrl_anchor_advantages"
CONTROLLER_FILE = "commrl_controller_rank{rank}.pt"
_actor_controller: weakref.ReferenceType[TwoCircuitController] | None = None


def register_actor_controller(controller: TwoCircuitController) -> None:
    """Make ``controller`` the one this process's reference engine reads its codec from."""
    global _actor_controller
    _actor_controller = weakref.ref(controller)


def actor_controller() -> TwoCircuitController | None:
    """The controller of the actor engine built last in this process (the fused actor/ref worker's actor)."""
    return _actor_controller() if _actor_controller is not None else None


class EngineByteLedger(ByteLedger):
    """The byte ledger as the engine keeps it: activation bytes of all data-parallel ranks, counted once.

    - Each rank's hooks see only its own tokens; weight updates and basis refreshes are counted at their
      full shapes on every rank, so at the end of a tick only ``activations_forward``/``_backward`` (with
      their dense equivalent and anchor share) are summed over ``group``: every rank reports the batch.
    - Gradient checkpointing re-runs each layer's forward inside the backward; the engine clears
      ``counting_forward`` once a forward is done, so those re-runs add no forward bytes.
    """

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.group, self.device = group, torch.device(device)
        self.counting_forward = True
        self._act_dense = self._act_anchor = 0.0
        self._replaying = False

    def add(self, channel: str, actual: float, dense: float) -> None:
        if channel == "activations_forward" and not self.counting_forward:
            return
        super().add(channel, actual, dense)
        if channel in ACTIVATION_CHANNELS:
            self._act_dense += dense
            if self._replaying:
                self._act_anchor += actual

    @contextmanager
    def anchor(self) -> Iterator[None]:
        with super().anchor():
            self._replaying = True
            try:
                yield
            finally:
                self._replaying = False

    def end_tick(self) -> dict[str, float]:
        if self.group is not None and dist.get_world_size(self.group) > 1:
            local = [self.tick_bytes[ch] for ch in ACTIVATION_CHANNELS] + [self._act_dense, self._act_anchor]
            summed = torch.tensor(local, dtype=torch.float64, device=self.device)
            dist.all_reduce(summed, group=self.group)
            total = summed.tolist()
            for i, ch in enumerate(ACTIVATION_CHANNELS):
                self.tick_bytes[ch] = total[i]
            self.tick_dense += total[2] - self._act_dense
            self.tick_anchor += total[3] - self._act_anchor
        self._act_dense = self._act_anchor = 0.0
        return super().end_tick()


def ratio_one(loss_function: Callable) -> Callable:
    """The GRPO loss at ratio one (method.md §3.3): ``old_log_probs`` := the pass's own detached log-probs."""

    def loss(model_output: dict, data, dp_group=None):
        data = data.copy()
        data["old_log_probs"] = no_padding_2_padding(model_output["log_probs"].detach(), data).to(
            data["old_log_probs"].dtype
        )
        return loss_function(model_output=model_output, data=data, dp_group=dp_group)

    return loss


def dense_reference(loss_function: Callable) -> Callable:
    """The loss against the dense reference (method.md §3.3: the anchor's replay is dense):
    ``ref_log_prob`` := the batch's ``DENSE_REF_KEY``."""

    def loss(model_output: dict, data, dp_group=None):
        data = data.copy()
        data["ref_log_prob"] = data[DENSE_REF_KEY]
        return loss_function(model_output=model_output, data=data, dp_group=dp_group)

    return loss


def anchor_replay_data(data):
    """The batch the anchor's replay trains on (method.md §4b, decoupled mode): with ``ANCHOR_MASK_KEY``,
    ``response_mask`` and ``loss_mask`` := it (verl's ``batch_num_tokens`` is the sum of ``loss_mask``),
    ``advantages`` := ``ANCHOR_ADV_KEY``, ``rollout_is_weights`` := ``ANCHOR_IS_KEY`` (removed without it):
    the dense old pass's correction, not the compressed one verl applied to the batch. Otherwise ``data``."""
    if ANCHOR_MASK_KEY not in data:
        return data
    data = data.copy()
    mask = data[ANCHOR_MASK_KEY].to(data["response_mask"].dtype)
    data["response_mask"], data["loss_mask"], data["advantages"] = mask, mask, data[ANCHOR_ADV_KEY]
    if ANCHOR_IS_KEY in data:
        data["rollout_is_weights"] = data[ANCHOR_IS_KEY]
    else:
        data.pop("rollout_is_weights", None)
    return data


def empty_safe(loss_function: Callable | None) -> Callable | None:
    """The loss of a mini-batch with no token in its loss mask (a fully rejected one) as 0 with a zero
    gradient, as the local driver's (``commrl.rl.grpo``), not verl's token-mean ``0 / 0``.

    verl's ``token-mean`` divides by the mini-batch's global token count (``batch_num_tokens``, counted from
    ``loss_mask`` before the loss runs): at 0 the loss and every gradient are NaN. verl's optimizer skips a
    non-finite step, but the codec would keep the NaN: PowerSGD's error feedback and the sign memory carry it
    into every later tick, whose steps are then all skipped. With the count raised to 1 the masked sums are
    exactly 0, and so is every gradient."""
    if loss_function is None:
        return None

    def loss(model_output: dict, data, dp_group=None):
        if tu.get_non_tensor_data(data=data, key="batch_num_tokens", default=None) == 0:
            data = data.copy()
            tu.assign_non_tensor(data, batch_num_tokens=1)
        return loss_function(model_output=model_output, data=data, dp_group=dp_group)

    return loss


def counting_effective_tokens(loss_function: Callable | None) -> Callable | None:
    """verl's ``ppo_loss`` that also returns, per micro-batch, ``effective_token_counts`` (commrl.rl.grpo,
    as the local driver counts them) as ``actor/effective_tokens`` / ``actor/eligible_tokens`` (summed).

    The policy-gradient loss is recomputed from the pass's own ``log_probs`` with the worker's loss
    function and inputs (``old_log_probs``, ``advantages``, ``response_mask``, ``rollout_is_weights``):
    elementwise work and an ``autograd.grad`` down to the log-probs, no model pass. Eligible tokens come
    from the trainer (``ELIGIBLE_KEY``: decoupled rejection zeroes the advantages of the tokens it masks,
    so the worker cannot tell them). Any other loss function, and a batch without the key, is unchanged.
    """
    if not (isinstance(loss_function, partial) and loss_function.func is ppo_loss):
        return loss_function
    config = loss_function.keywords.get("config")
    if config is None:
        return loss_function

    def loss(model_output: dict, data, dp_group=None):
        out, metrics = loss_function(model_output=model_output, data=data, dp_group=dp_group)
        if ELIGIBLE_KEY in data and model_output["log_probs"].requires_grad:
            carrying, eligible = effective_tokens(config, model_output, data)
            metrics[EFFECTIVE_TOKENS] = Metric(AggregationType.SUM, carrying)
            metrics[ELIGIBLE_TOKENS] = Metric(AggregationType.SUM, eligible)
        return out, metrics

    return loss


def effective_tokens(config, model_output: dict, data) -> tuple[int, int]:
    """(carrying, eligible) tokens of one micro-batch: ``effective_token_counts`` on the policy loss of
    ``config.policy_loss.loss_mode`` (vanilla, bypass_mode, ...), as ``ppo_loss`` computes it."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    from commrl.rl.grpo import effective_token_counts

    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    names = ["response_mask", "old_log_probs", "advantages", ELIGIBLE_KEY]
    if "rollout_is_weights" in data:
        names.append("rollout_is_weights")
    padded = data.select(*names).to_padded_tensor()
    pg_loss, _ = get_policy_loss_fn(config.policy_loss.get("loss_mode", "vanilla"))(
        old_log_prob=padded["old_log_probs"],
        log_prob=log_prob,
        advantages=padded["advantages"],
        response_mask=padded["response_mask"].to(bool),
        loss_agg_mode=config.loss_agg_mode,
        config=config,
        rollout_is_weights=padded.get("rollout_is_weights", None),
    )
    eligible = padded[ELIGIBLE_KEY].to(bool)
    # the trainer decided eligibility (valid before rejection, nonzero advantage): the mask is both
    # effective_token_counts' mask and the support of its advantages
    return effective_token_counts(pg_loss, log_prob, eligible, eligible)


def token_mask(engine: Any, micro_batch) -> Tensor | None:
    """The (batch, tokens) mask of real tokens in the layout the engine feeds the model; None = all real.

    Padded inputs (``use_remove_padding=False``): verl's attention mask. Packed inputs: None, or the
    packed row with its bucket padding (``pad_to_length``) marked False.
    """
    input_ids = micro_batch["input_ids"]
    if not tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
        max_len = int(input_ids.offsets().diff().max().item())
        return build_attention_mask_from_nested(input_ids=input_ids, max_seq_len=max_len).bool()
    total = int(input_ids.offsets()[-1].item())
    pad = engine._get_packed_pad_size(total)
    if not pad:
        return None
    mask = torch.ones(1, total + pad, dtype=torch.bool)
    mask[0, total:] = False
    return mask


class TwoCircuitEngineMixin:
    """The two circuits on top of an ``FSDPEngineWithLMHead`` subclass (see the module docstring)."""

    controller: TwoCircuitController | None = None
    method: MethodConfig | None = None

    # -- building ------------------------------------------------------------------------------------------
    def _build_fsdp_module(self, module):
        module = super()._build_fsdp_module(module)
        self.method = method_from_env()
        self.controller, self._ref_points = None, None
        self._pass: str | None = None
        self._open_session = ExitStack()
        self._microbatch = 0
        self._in_tick = False
        if self.method is None or (self.engine_config.forward_only and self.method.kl_ref_forward == "dense"):
            return module
        self._check_layout(module)
        if self.engine_config.forward_only:
            self._ref_points = _LazyRefPoints(module)
            return module
        self.controller = TwoCircuitController(module, self.method, snapshot_device="cpu")
        group = self.get_data_parallel_group() if dist.get_world_size() > 1 else None
        ledger = EngineByteLedger(group, device=_collective_device())
        self.controller.ledger = self.controller.points.ledger = ledger
        register_actor_controller(self.controller)
        return module

    def _check_layout(self, module) -> None:
        """``config.layout_error`` of the module this engine built (``check_method_layout`` asked the
        config before Ray started; this is the layout verl actually made)."""
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        forward_only = self.engine_config.forward_only
        error = layout_error(
            "ref" if forward_only else "actor",
            fsdp1=isinstance(module, FSDP),
            ulysses=self.engine_config.ulysses_sequence_parallel_size,
            hybrid=getattr(self.device_mesh, "ndim", 1) > 1,
            # the anchor loads its view into the FSDP2 shards; a forward re-gathers them only from
            # resharded groups, so every group must reshard after its forward
            keeps_gathered=not forward_only
            and isinstance(module, FSDPModule)
            and not self.engine_config.reshard_after_forward,
            anchor=self.method.anchor,
        )
        if error:
            raise ConfigError(error)

    # -- passes ----------------------------------------------------------------------------------------------
    def infer_batch(self, data, loss_function=None):
        ctrl = self.controller
        if ctrl is not None and ctrl.is_calibration_tick():  # anchor off: Q before tick 0's old log-probs
            self._pass = "sketch"
            try:
                ctrl.calibrate(lambda: self.forward_backward_batch(data, None, True))
            finally:
                self._pass = None
        self._pass, self._microbatch = self._infer_pass(data), 0
        try:
            return super().infer_batch(data, loss_function)
        finally:
            self._pass = None

    def _infer_pass(self, data) -> str | None:
        """The pass of a forward-only request: the reference's ``DENSE_REFERENCE`` without a session, the
        actor's ``OLD_PASS`` (``dense`` | ``readout``), else ``infer`` (through the codec, counted)."""
        if self._ref_points is not None:
            dense = tu.get_non_tensor_data(data=data, key=DENSE_REFERENCE, default=False)
            return None if dense else "infer"
        mode = tu.get_non_tensor_data(data=data, key=OLD_PASS, default="infer")
        if mode not in ("infer", *OLD_PASSES):
            raise ValueError(f"{OLD_PASS}={mode!r} is not one of {', '.join(OLD_PASSES)}")
        return mode

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        try:
            return super().forward_backward_batch(data, loss_function, forward_only)
        finally:
            self._open_session.close()

    def forward_step(self, micro_batch, loss_function, forward_only):
        """The micro-batch's forward in its compression session, which stays open for its backward."""
        self._open_session.close()
        self._open_session.enter_context(self._session(micro_batch))
        ledger = self._ledger()
        if ledger is not None:
            ledger.counting_forward = True
        try:
            return super().forward_step(micro_batch, loss_function=loss_function, forward_only=forward_only)
        finally:
            if ledger is not None:
                ledger.counting_forward = False

    def _ledger(self) -> EngineByteLedger | None:
        ctrl = self.controller if self._ref_points is None else self._ref_points.controller
        ledger = ctrl.ledger if ctrl is not None else None
        return ledger if isinstance(ledger, EngineByteLedger) else None

    def _session(self, micro_batch):
        """This forward's compression session, by pass; none inside ``fire``/``calibrate`` (theirs is on)."""
        if self._pass in (None, "replay", "sketch"):
            return nullcontext()
        if self._ref_points is not None:
            return self._ref_points.session(self._next_microbatch(), token_mask(self, micro_batch))
        if self.controller is None:
            return nullcontext()
        if self._pass == "dense":
            return self.controller.dense(token_mask=token_mask(self, micro_batch))
        return self.controller.compressed(
            microbatch_id=self._next_microbatch(),
            token_mask=token_mask(self, micro_batch),
            counted=self._pass != "readout",
        )

    def _next_microbatch(self) -> int:
        """The pass's next micro-batch as the PRF masks' key: ``j D + r`` for this rank's ``j``-th of the
        pass on data-parallel rank ``r`` of ``D``, so that no two ranks draw the same masks (method.md §2
        keys them by micro-batch, and each rank's are other micro-batches); one rank keeps ``j``, as the
        local driver numbers them."""
        j, self._microbatch = self._microbatch, self._microbatch + 1
        return j * self.get_data_parallel_size() + self.get_data_parallel_rank()

    # -- one mini-batch = one optimizer step ---------------------------------------------------------------
    def train_batch(self, data, loss_function):
        ctrl = self.controller
        loss_function = counting_effective_tokens(loss_function)
        if ctrl is None:
            return super().train_batch(data, loss_function)
        loss_function = empty_safe(loss_function)
        tu.maybe_fix_3d_position_ids(data)
        first = not self._in_tick
        if first:
            self._in_tick, self._microbatch = True, 0
        extra: dict[str, float] = {}
        if self.method.dense_reference_due(ctrl.tick) and "ref_log_prob" in data:
            if DENSE_REF_KEY not in data:
                raise ConfigError(
                    f"tick {ctrl.tick} fires the anchor, whose dense replay needs the reference's dense "
                    f"log-probs ({DENSE_REF_KEY}) besides the codec's (method.kl_ref_forward=codec); "
                    "train with commrl verl-train (CommrlPPOTrainer adds them), or set "
                    "method.kl_ref_forward=dense"
                )
            loss_function = dense_reference(loss_function)
        try:
            if ctrl.is_fire_tick() and first:
                outputs = {}
                data = anchor_replay_data(data)

                def dense_replay() -> None:
                    self.optimizer_zero_grad()
                    outputs.update(self.forward_backward_batch(data, ratio_one(loss_function)))

                def codec_replay() -> None:  # the same replay through the codec, for anchor/grad_cosine_*
                    self.optimizer_zero_grad()
                    self._pass, self._microbatch = "compressed", 0
                    try:
                        self.forward_backward_batch(data, ratio_one(loss_function))
                    finally:
                        self._pass = "replay"

                self._pass = "replay"
                ctrl.fire(dense_replay, codec_replay)
            else:
                if first and ctrl.is_calibration_tick():  # no old-log-prob pass calibrated it
                    self._pass = "sketch"
                    ctrl.calibrate(lambda: self.forward_backward_batch(data, None, True))
                fired = ctrl.is_fire_tick()
                self._pass = "dense" if fired else "compressed"
                self.optimizer_zero_grad()
                outputs = self.forward_backward_batch(data, loss_function, forward_only=False)
                if fired:  # a fire tick's later mini-batches: dense updates
                    dense = _grad_bytes(ctrl)
                    ctrl.ledger.add("weights", dense, dense)
                else:
                    ctrl.compress_gradients()
        finally:
            self._pass = None
        # method.fast_step=false: fast ticks take no optimizer step (the next mini-batch zeroes the grads)
        grad_norm = self.optimizer_step() if ctrl.is_update_tick() else ctrl.grad_norm()
        # An fp16 loss scaler expects an occasional inf norm (it lowers its scale): not guarded, and the
        # codec's state is then not protected from it. Pairs A and B train in bf16, with no scaler.
        if getattr(self, "scaler", None) is None and not math.isfinite(grad_norm):
            raise NonFiniteLossError(
                f"non-finite gradient norm ({grad_norm}) at tick {ctrl.tick}: verl skips the step, but the "
                "codec's state (PowerSGD's error feedback, the sign memory, the anchor's snapshots) would "
                "keep it and every later step would be skipped too; the run stops here, as the local driver "
                "does on a non-finite loss. A rerun resumes from the last checkpoint and, with the same seed "
                "and data, likely meets the same tick: lower the learning rate (or the method's alpha and "
                "beta), or check that tick's batch, before rerunning"
            )
        if tu.get_non_tensor_data(data=data, key="update_lr_scheduler", default=False):
            extra.update(ctrl.end_tick())
            self._in_tick = False
        if self.is_mp_src_rank_with_outputs():
            outputs["metrics"]["grad_norm"] = grad_norm
            outputs["metrics"].update({key: [float(value)] for key, value in extra.items()})
        return outputs

    # -- checkpoints -----------------------------------------------------------------------------------------
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None, **kwargs):
        super().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep, **kwargs)
        if self.controller is not None:
            path = Path(local_path) / CONTROLLER_FILE.format(rank=dist.get_rank())
            tmp = path.with_suffix(".tmp")
            torch.save(self.controller.state_dict(), tmp)
            os.replace(tmp, path)

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=True, **kwargs):
        path = Path(local_path) / CONTROLLER_FILE.format(rank=dist.get_rank())
        state = None
        if self.controller is not None:
            if not path.exists():
                raise FileNotFoundError(
                    f"{path} is missing: checkpoint {local_path} was not written by the two-circuit engine "
                    "(or with another data-parallel size); resume it with the stock engine or start afresh"
                )
            state = torch.load(path, map_location="cpu", weights_only=False)
        super().load_checkpoint(local_path, hdfs_path, del_local_after_load, **kwargs)
        if state is not None:
            # to the training device: with param_offload verl's load leaves the parameters on the CPU, and
            # the error, Q and memory placed beside them met the GPU's gradients at the next fast tick
            self.controller.load_state_dict(state, device=_collective_device())
            self._in_tick = False


class _LazyRefPoints:
    """Compression points on the reference model that use the actor controller's codec and ledger.

    The fused worker builds the reference engine before the actor, so the points attach at the first
    reference forward.
    """

    def __init__(self, module) -> None:
        self.module = module
        self.points: CompressionPoints | None = None
        self.controller: TwoCircuitController | None = None

    def session(self, microbatch: int, mask: Tensor | None):
        ctrl = actor_controller()
        if ctrl is None:
            raise RuntimeError(
                "the reference model's forward goes through the actor's codec (method.kl_ref_forward=codec), "
                "but no two-circuit actor engine lives in this process; run the reference inside the actor "
                "worker (verl's fused actor_rollout_ref worker) or set method.kl_ref_forward=dense"
            )
        if self.controller is not ctrl:
            if self.points is not None:
                self.points.remove()
            self.points, self.controller = ctrl.compression_points(self.module), ctrl
        return self.points.session("compressed", ctrl.tick, microbatch, mask)


def _grad_bytes(ctrl: TwoCircuitController) -> float:
    """Bytes of the full (unsharded) gradients of the controller's parameters."""
    grads = [p.grad for p in ctrl.params.values() if p.grad is not None]
    return float(sum(g.numel() * local_tensor(g).element_size() for g in grads))


def _collective_device() -> torch.device:
    """Where a tensor for a collective lives: the accelerator for NCCL, the CPU for gloo."""
    name = get_device_name()
    return torch.device("cpu") if name == "cpu" else torch.device(name, get_device_id())


@EngineRegistry.register(
    model_type="language_model", backend=["fsdp", "fsdp2"], device="cuda", vendor="nvidia"
)
class TwoCircuitFSDPEngine(TwoCircuitEngineMixin, FSDPEngineWithLMHead):
    """verl's FSDP engine with the two circuits: replaces the stock one on (cuda, nvidia), same strategies."""
