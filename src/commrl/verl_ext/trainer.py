"""verl's PPO trainer (the legacy ``RayPPOTrainer``) with commrl's read-outs, and the TaskRunner building it.

verl 0.9.1's default trainer (``trainer.use_v1=true``) needs the TransferQueue package (``verl[verl-core]``),
so ``commrl verl-train`` runs the legacy trainer (``trainer.use_v1=false``) through ``main_ppo.run_ppo`` with
``CommrlTaskRunner``, the recipe hook verl documents ("For recipe to change TaskRunner").

What it adds to verl's metrics (nothing is renamed away; verl's own names stay):

- ``mismatch/*`` (method.md §4) from the sampler's ``rollout_log_probs`` against the trainer's
  ``old_log_probs`` -- verl's own ``training/rollout_probs_diff_*`` and
  ``training/rollout_actor_probs_pearson_corr`` compare *probabilities*; §4 correlates *log-probs*;
- the method.md §4 names of what verl logs under its own names (``method_metrics``): ``score/mean``,
  ``comm/*``, ``anchor/*``, ``codec/*`` and ``sign_memory/*`` (the engine's, logged by verl as
  ``actor/comm/...``), ``rollout_corr/*`` (in bypass mode verl's loss in the workers returns them, logged
  as ``actor/rollout_corr/...``), ``val/acc``, ``time/step_s``, and ``time/sample_s``, ``time/train_s``
  as the local driver times a tick (``TIMING_SUMS``: verl's ``timing_s/update_actor`` alone leaves out the
  old and reference passes);
- ``health/alarm`` each step, from the local driver's ``CollapseMonitor`` (``StepChecks``), whose state is
  saved beside verl's checkpoints (``global_step_<n>/commrl_health.json``);
- ``actor/effective_token_frac``: of the response tokens eligible for gradient (valid before rejection,
  nonzero advantage; ``eligible_mask``), the fraction whose policy-gradient loss has a nonzero gradient
  after clipping and correction, counted by the engine (``counting_effective_tokens``).

On an anchor fire with the reference through the codec (``MethodConfig.dense_reference_due``) the trainer
also asks the reference worker for its dense log-probs (``engine.DENSE_REFERENCE``), which the anchor's dense
updates take their KL term against (``engine.DENSE_REF_KEY``).

``actor/kl_loss`` is the local driver's read-out wherever the trainer's old pass ran (decoupled mode: every
step; bypass mode: a fire step's read-out pass): the old pass against the reference over every valid
response token (``kl_readout``). verl's own value is its training loss's KL term, per mini-batch (the later
ones at weights that have moved), with the training pass's attention dropout (the ``dropout`` condition) and
over the tokens a decoupled rejection kept; on a fire step, the dense replay's at the projected weights. A
bypass-mode fast step has no other pass and keeps verl's.

verl logs the rollout correction's ``rollout_corr/*`` itself (decoupled mode: its trainer, every step;
bypass mode: the workers' ``bypass_mode`` loss). In bypass mode the trainer's old pass does not run
(``old_log_probs`` are the sampler's), so ``mismatch/*`` are not logged. A fire tick with the sampler's
log-probs adds one actor pass before its update (``_fire_pass``, ``engine.OLD_PASS``), as the local driver:

- decoupled mode with a correction: a dense old pass, counted; its correction against the sampler
  (``commrl.rl.correction.correct``) is the anchor replay's (``engine.anchor_replay_data``: mask, weights,
  and the advantages before any rejection, ``valid_advantages``), logged as ``anchor/rollout_corr/*``;
- bypass mode, where verl's bypass loss reads the ratio-one replay (``rho = 1``: no mismatch): a pass through
  the codec, uncounted, for ``rollout_corr/*`` (verl's ``actor/rollout_corr/*`` stay the replay's) and
  ``actor/kl_loss``.

Each actor update is also checked for the engine's ``comm/*`` metrics when ``COMMRL_METHOD`` is set: without
them verl built its stock engine (another device or vendor, ``external_lib`` overridden), which trains
dense, and the run stops at its first tick. verl's MLflow backend is attached to the run of
``MLFLOW_RUN_ID`` with ``commrl.run.record.log_config``, so that a resume whose config changed (e.g. more
ticks) keeps logging instead of losing its MLflow backend to MLflow's immutable params.

Preemption: ``CommrlTaskRunner`` watches SIGUSR1 and SIGTERM (``commrl.run.preempt``) in its own process.
When one arrived, the trainer finishes the step it is in (verl logs it), saves it with verl's own
``_save_checkpoint`` (skipped when the step was a ``save_freq`` step) and raises ``preempt.Preempted`` out
of ``fit``; ``commrl verl-train`` marks the MLflow run preempted and exits 75.

A resume at step n validates before its first step only when n's validation was due and the MLflow run
has no ``val/acc`` at n (``checkpoint.validation_missing``): verl saves a ``save_freq`` step before it
validates and logs it, so a hard kill (SIGTERM, OOM, a lost node) during that validation loses it. verl's
``val_before_train`` then logs it at step n in the same run (verl's names, and ``val/acc``); otherwise a
resume validates nothing (no second value at n). With ``trainer.val_only`` (``commrl verl-train`` on a run
whose checkpoints reach its ticks) the loaded step is validated and ``fit`` returns without training.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

import ray
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.metric import reduce_metrics

from commrl import tracking
from commrl.compression.config import MethodConfig
from commrl.errors import ConfigError
from commrl.rl.config import HealthConfig
from commrl.rl.correction import Correction, RolloutCorrection, correct
from commrl.rl.health import CollapseMonitor
from commrl.rl.mismatch import mismatch_metrics
from commrl.run import preempt
from commrl.verl_ext.checkpoint import latest_tick, restore_epoch_end, step_dir, validation_missing
from commrl.verl_ext.config import METHOD_ENV, method_from_env
from commrl.verl_ext.engine import (
    ANCHOR_ADV_KEY,
    ANCHOR_IS_KEY,
    ANCHOR_MASK_KEY,
    DENSE_REF_KEY,
    DENSE_REFERENCE,
    EFFECTIVE_TOKENS,
    ELIGIBLE_KEY,
    ELIGIBLE_TOKENS,
    OLD_PASS,
)

ALIASES = {"critic/score/mean": "score/mean", "timing_s/step": "time/step_s"}
# The local driver's two phases of a tick (commrl.rl.trainer's _tick) as sums of verl's timers (fit's
# marked_timer names): sampling is all before the trainer's first pass (generation and scoring), training
# the passes and the advantage between them (old, reference, values, update); the network model hides
# communication behind time/train_s, and the activations it sends are those of every counted pass.
TIMING_SUMS = {
    "time/sample_s": ("timing_s/gen", "timing_s/reward"),
    "time/train_s": tuple(
        f"timing_s/{name}"
        for name in ("old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")
    ),
}
ENGINE_PREFIXES = ("comm/", "anchor/", "codec/", "sign_memory/")
# verl's bypass-mode loss returns its rollout_corr/* read-outs from the workers (logged as
# actor/rollout_corr/*); in decoupled mode verl's trainer logs them as rollout_corr/* (LOGGED_METRICS), and
# so does CommrlPPOTrainer on a bypass fire tick (its read-out pass)
LOSS_PREFIXES = ("rollout_corr/",)
# verl's core validation metric: val-core/<data_source>/acc/mean@<n>; commrl's data sources hold a slash
VAL_ACC = re.compile(r"val-core/.+/acc/mean@\d+")
HEALTH_INPUTS = ("actor/kl_loss", "actor/pg_clipfrac", "mismatch/logprob_corr")  # what CollapseMonitor reads
HEALTH_FILE = "commrl_health.json"


def method_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The method.md §4 names of verl's metrics of one step (to log beside verl's own).

    ``val/acc`` is the mean over the validation data sources of verl's core ``acc/mean@N``;
    ``time/sample_s`` and ``time/train_s`` the sums of verl's timers in ``TIMING_SUMS`` that the step has.
    """
    out = {name: float(metrics[key]) for key, name in ALIASES.items() if key in metrics}
    for name, keys in TIMING_SUMS.items():
        if any(key in metrics for key in keys):
            out[name] = sum(float(metrics[key]) for key in keys if key in metrics)
    for key, value in metrics.items():
        short = key.removeprefix("actor/")
        if short != key and short.startswith(ENGINE_PREFIXES + LOSS_PREFIXES) and short not in metrics:
            out[short] = float(value)
    accs = [float(value) for key, value in metrics.items() if VAL_ACC.fullmatch(key)]
    if accs:
        out["val/acc"] = sum(accs) / len(accs)
    return out


@contextmanager
def logging_method_names(after_log: Callable[[int], None] | None = None) -> Iterator[None]:
    """While active, every ``verl.utils.tracking.Tracking`` logs ``method_metrics`` beside verl's names, and
    attaches its MLflow backend to the run of ``MLFLOW_RUN_ID`` (``attach_mlflow``); ``after_log(step)`` is
    called after each log (``fit`` logs once per finished step, and once after its first validation).

    ``RayPPOTrainer.fit`` builds its ``Tracking`` inside and offers no hook on what it logs, so the class is
    swapped for a subclass in this process for the duration of ``fit``.
    """
    import verl.utils.tracking as verl_tracking

    stock = verl_tracking.Tracking

    class MethodNamesTracking(stock):
        def __init__(self, project_name, experiment_name, default_backend="console", config=None):
            backends = [default_backend] if isinstance(default_backend, str) else list(default_backend)
            run_id = os.environ.get("MLFLOW_RUN_ID") if "mlflow" in backends else None
            if run_id:
                backends.remove("mlflow")
            super().__init__(project_name, experiment_name, backends, config)
            if run_id:
                self.logger["mlflow"] = attach_mlflow(run_id, config)

        def log(self, data, step, backend=None):
            super().log({**data, **method_metrics(data)}, step, backend)
            if after_log is not None:
                after_log(step)

    verl_tracking.Tracking = MethodNamesTracking
    try:
        yield
    finally:
        verl_tracking.Tracking = stock


def attach_mlflow(run_id: str, config: Mapping[str, Any] | None):
    """verl's MLflow logging adapter on the existing run ``run_id``, the config logged as verl logs it.

    verl's own set-up calls ``mlflow.log_params``, which fails on a resume whose config changed (MLflow
    params are immutable) and then drops the backend: the resumed ticks would log nothing.
    ``commrl.run.record.log_config`` logs the new keys and records the changed ones instead.
    """
    import mlflow
    from verl.utils.tracking import _compute_mlflow_params_from_objects, _MlflowLoggingAdapter

    from commrl.run.record import log_config

    uri = tracking.default_tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.start_run(run_id=run_id)
    changed = log_config(run_id, _compute_mlflow_params_from_objects(config), uri)
    if changed:
        print(f"commrl: resumed MLflow run {run_id} with changed config keys: {', '.join(sorted(changed))}")
    return _MlflowLoggingAdapter()


def batch_mismatch(batch) -> dict[str, float]:
    """``mismatch/*`` of a trainer step's ``DataProto``: the sampler's ``rollout_log_probs`` against the
    trainer's ``old_log_probs`` on every valid response token (verl's ``compute_response_mask``, as the
    local driver: decoupled rejection has replaced ``response_mask`` by the tokens it kept, the ones that
    mismatch least); empty when the sampler recorded none."""
    from verl.trainer.ppo.ray_trainer import compute_response_mask

    tensors = batch.batch
    if "rollout_log_probs" not in tensors.keys():  # noqa: SIM118  (a TensorDict)
        return {}
    return mismatch_metrics(
        tensors["rollout_log_probs"], tensors["old_log_probs"], compute_response_mask(batch)
    )


def valid_advantages(batch, config):
    """(batch, response) advantages on every valid response token: the batch's, or, where verl's decoupled
    rejection masked tokens, recomputed without it.

    Valid = verl's ``compute_response_mask`` (the attention mask over the response; commrl's rollouts are
    single-turn, where it is the sampler's ``response_mask``). verl's decoupled rejection replaces
    ``response_mask`` before the advantages, which its estimators multiply by the mask; there the advantages
    are recomputed on a shallow copy with the valid mask (verl's ``compute_advantage``, the trainer's own
    arguments), as the local driver computes them (``grpo.grpo_advantages`` on the sampler's mask).
    """
    import torch
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage, compute_response_mask

    tensors = batch.batch
    valid = compute_response_mask(batch).bool()
    if torch.equal(valid, tensors["response_mask"].bool()):
        return tensors["advantages"]
    probe = DataProto(
        batch=tensors.clone(recurse=False),
        non_tensor_batch=dict(batch.non_tensor_batch),
        meta_info=dict(batch.meta_info),
    )
    probe.batch["response_mask"] = valid.to(tensors["response_mask"].dtype)
    algorithm = config.algorithm
    probe = compute_advantage(
        probe,
        adv_estimator=algorithm.adv_estimator,
        gamma=algorithm.gamma,
        lam=algorithm.lam,
        num_repeat=config.actor_rollout_ref.rollout.n,
        norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True),
        config=algorithm,
    )
    return probe.batch["advantages"]


def eligible_mask(batch, advantages):
    """(batch, response) bool mask of the tokens eligible for gradient (``commrl.rl.grpo.
    effective_token_counts``' eligibility): valid response tokens (verl's ``compute_response_mask``, before
    rejection) whose ``advantages`` (``valid_advantages``) are nonzero, so a rejected token counts."""
    from verl.trainer.ppo.ray_trainer import compute_response_mask

    return compute_response_mask(batch).bool() & (advantages != 0)


def rollout_correction(config) -> RolloutCorrection:
    """verl's ``algorithm.rollout_correction`` as the local driver's ``RolloutCorrection`` (its keys, less
    ``bypass_mode``); every key off when the block is absent."""
    block = config.algorithm.get("rollout_correction", None) or {}
    return RolloutCorrection(**{f.name: block[f.name] for f in fields(RolloutCorrection) if f.name in block})


def sampler_correction(batch, log_probs, config) -> Correction:
    """``commrl.rl.correction.correct(log_probs, rollout_log_probs)`` over every valid response token (verl's
    ``compute_response_mask``) with the run's ``rollout_correction``: weights, rejection mask and the
    ``rollout_corr/*`` read-outs of ``rho_t = pi(y_t) / pi_sampler(y_t)``, as the local driver computes
    them for its old passes."""
    from verl.trainer.ppo.ray_trainer import compute_response_mask

    sampler = batch.batch["rollout_log_probs"]
    return correct(log_probs, sampler, compute_response_mask(batch), rollout_correction(config))


def anchor_inputs(corr: Correction, advantages) -> dict[str, Any]:
    """The anchor replay's loss inputs (``engine.anchor_replay_data``) from the dense old pass's correction
    ``corr``: its rejection mask, its IS weights (when ``rollout_is`` is on) and ``advantages`` (before any
    rejection): the replay's per-token loss is ``w_t * L_t`` over ``corr.mask`` (method.md §4b)."""
    out = {ANCHOR_MASK_KEY: corr.mask, ANCHOR_ADV_KEY: advantages}
    if corr.weights is not None:
        out[ANCHOR_IS_KEY] = corr.weights
    return out


def effective_token_frac(metrics: dict[str, Any]) -> None:
    """Replace the engine's per-mini-batch token counts in ``metrics`` (an update's, verl's names) by
    ``actor/effective_token_frac`` = carrying / eligible over the tick (0 when nothing is eligible)."""
    carrying, eligible = metrics.pop(EFFECTIVE_TOKENS, None), metrics.pop(ELIGIBLE_TOKENS, None)
    if carrying is None or eligible is None:
        return
    total = float(sum(_as_list(eligible)))
    metrics["actor/effective_token_frac"] = float(sum(_as_list(carrying))) / total if total > 0 else 0.0


def kl_readout(batch, actor, old_log_probs) -> float:
    """``actor/kl_loss`` as the local driver logs it: the trainer's old pass ``old_log_probs`` (decoupled:
    the batch's; bypass: a fire step's read-out pass) against the reference pass (through the codec under
    ``kl_ref_forward: codec``) over every valid response token of the step's batch (``grpo.batch_kl``,
    verl's estimator and aggregation). Valid = verl's ``compute_response_mask``, as in ``batch_mismatch``:
    decoupled rejection has replaced ``response_mask`` by the tokens it kept; the local driver reads every
    valid one."""
    from verl.trainer.ppo.ray_trainer import compute_response_mask

    from commrl.rl.grpo import batch_kl

    mask = compute_response_mask(batch).bool()
    kl = batch_kl(actor.kl_loss_type, actor.loss_agg_mode, old_log_probs, batch.batch["ref_log_prob"], mask)
    return float(kl)


def _as_list(value: Any) -> list[float]:
    return [float(v) for v in value] if isinstance(value, list | tuple) else [float(value)]


def bypass_mode(config) -> bool:
    """verl's ``algorithm.rollout_correction.bypass_mode``: the sampler's log-probs are the old ones."""
    correction = config.algorithm.get("rollout_correction", None)
    return bool(correction and correction.get("bypass_mode", False))


def require_engine_metrics(method: MethodConfig | None, metrics: Mapping[str, Any]) -> None:
    """Raise ``ConfigError`` when ``COMMRL_METHOD`` is set but the actor update returned no ``comm/*``:
    verl built its stock engine, which ignores the method (trains dense, counts no bytes)."""
    if method is None or any(key.startswith("actor/comm/") for key in metrics):
        return
    raise ConfigError(
        f"{METHOD_ENV} asks for codec={method.codec}, grad_codec={method.grad_codec}, "
        f"anchor={method.anchor}, but the actor's update returned no comm/* metrics: verl built its stock "
        "engine, which trains dense. "
        "commrl's engine is registered for device cuda, vendor nvidia (commrl.verl_ext.TwoCircuitFSDPEngine) "
        "and loaded by actor_rollout_ref.model.external_lib=commrl.verl_ext: train on NVIDIA GPUs, keep "
        "that external_lib and leave VERL_ENGINE_DEVICE / VERL_ENGINE_VENDOR unset"
    )


class StepChecks:
    """What the trainer checks and adds after each actor update: the engine guard and ``health/alarm``."""

    def __init__(self, method: MethodConfig | None, health: HealthConfig) -> None:
        self.method = method
        self.monitor = CollapseMonitor(health)

    def after_update(self, metrics: dict[str, Any], step: int) -> None:
        """Check ``metrics`` (the update's, verl's names) and add ``health/alarm`` to them."""
        require_engine_metrics(self.method, metrics)
        inputs = reduce_metrics({key: metrics[key] for key in HEALTH_INPUTS if key in metrics})
        reasons = self.monitor.update({key: float(value) for key, value in inputs.items()})
        metrics["health/alarm"] = float(bool(reasons))
        if reasons:
            print(f"commrl: collapse alarm at step {step}: {'; '.join(reasons)}", file=sys.stderr)

    def save(self, folder: Path) -> None:
        """The monitor's state into ``folder/commrl_health.json`` (through a temporary file)."""
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{HEALTH_FILE}.tmp"
        tmp.write_text(json.dumps(self.monitor.state_dict()))
        os.replace(tmp, folder / HEALTH_FILE)

    def load(self, folder: Path) -> None:
        """The monitor's state from ``folder/commrl_health.json``; a fresh window when the file is missing."""
        path = folder / HEALTH_FILE
        if path.exists():
            self.monitor.load_state_dict(json.loads(path.read_text()))
        else:
            print(f"commrl: {path} is missing; the collapse monitor starts a fresh window", file=sys.stderr)


class CommrlPPOTrainer(RayPPOTrainer):
    """``RayPPOTrainer`` that logs ``mismatch/*``, ``health/alarm`` and the method.md §4 names, and stops
    after a step with a checkpoint when the job's end is announced (``stop_if_preempted``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.checks = StepChecks(method_from_env(), HealthConfig())

    def _dense_reference_due(self) -> bool:
        """Whether this step (tick ``global_steps - 1``) fires the anchor, the reference through a codec."""
        method = self.checks.method
        return method is not None and method.dense_reference_due(self.global_steps - 1)

    def _compute_ref_log_prob(self, batch):
        """verl's reference pass; on a ``_dense_reference_due`` step its dense one too (``DENSE_REF_KEY``).

        In bypass mode verl runs no old pass, so on a calibration tick (anchor off, tick 0) the reference
        pass would be the tick's first through the codec, on the random basis: an actor read-out pass
        (uncounted) first calibrates it, as the old pass does in decoupled mode (method.md §3)."""
        method = self.checks.method
        if method is not None and bypass_mode(self.config) and method.calibration_due(self.global_steps - 1):
            self._actor_log_probs(batch, "readout")
        ref = super()._compute_ref_log_prob(batch)
        if self._dense_reference_due():
            batch.meta_info[DENSE_REFERENCE] = True
            try:
                dense = super()._compute_ref_log_prob(batch)
            finally:
                batch.meta_info.pop(DENSE_REFERENCE)
            ref.batch[DENSE_REF_KEY] = dense.batch["ref_log_prob"]
        return ref

    def _fire_pass(self, batch) -> str | None:
        """The actor pass a fire tick (``global_steps - 1``) adds before its update (``engine.OLD_PASS``):
        ``dense`` in decoupled mode with a rollout correction (the anchor's correction, counted),
        ``readout`` in bypass mode (the tick's read-outs, uncounted: verl's bypass loss reads the ratio-one
        replay, ``rho = 1``); None on other ticks, and without the sampler's log-probs."""
        method = self.checks.method
        if method is None or not method.fires_at(self.global_steps - 1):
            return None
        if "rollout_log_probs" not in batch.batch.keys():  # noqa: SIM118  (a TensorDict)
            return None
        if bypass_mode(self.config):
            return "readout"
        return "dense" if rollout_correction(self.config).enabled else None

    def _actor_log_probs(self, batch, mode: str):
        """The actor's log-probs over ``batch`` from verl's old-log-prob request with ``OLD_PASS=mode``."""
        batch.meta_info[OLD_PASS] = mode
        try:
            old, _ = super()._compute_old_log_prob(batch)
        finally:
            batch.meta_info.pop(OLD_PASS)
        return old.batch["old_log_probs"]

    def _update_actor(self, batch):
        tensors, bypass = batch.batch, bypass_mode(self.config)
        advantages = valid_advantages(batch, self.config)
        added = {ELIGIBLE_KEY: eligible_mask(batch, advantages)}
        fire_pass = self._fire_pass(batch)  # before the update: at the tick's weights, as the old pass
        fire_old = self._actor_log_probs(batch, fire_pass) if fire_pass else None
        fire_corr = sampler_correction(batch, fire_old, self.config) if fire_pass else None
        if fire_pass == "dense":
            added.update(anchor_inputs(fire_corr, advantages))
        tensors.update(added)
        try:
            output = super()._update_actor(batch)
        finally:
            for key in added:
                tensors.pop(key)
        metrics = output.meta_info["metrics"]
        effective_token_frac(metrics)
        if fire_pass == "dense":  # the local driver's names for the anchor's correction
            metrics.update({f"anchor/{key}": value for key, value in fire_corr.metrics.items()})
        elif fire_pass == "readout":  # in place of the replay's (rho = 1), beside verl's actor/rollout_corr/*
            metrics.update(fire_corr.metrics)
        if not bypass:  # bypass: old_log_probs are the sampler's, nothing to compare
            metrics.update(batch_mismatch(batch))
        old = fire_old if bypass else tensors["old_log_probs"]
        if old is not None and "actor/kl_loss" in metrics:
            metrics["actor/kl_loss"] = kl_readout(batch, self.config.actor_rollout_ref.actor, old)
        self.checks.after_update(metrics, self.global_steps)
        return output

    def _step_folder(self) -> Path:
        """Where verl saves (and resumes) this step's checkpoint."""
        return step_dir(Path(self.config.trainer.default_local_dir).absolute(), self.global_steps)

    def _save_checkpoint(self):
        self.checks.save(self._step_folder())  # before verl's tracker file names the folder
        super()._save_checkpoint()

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        if self.global_steps > 0:
            folder = self._step_folder()
            self.checks.load(folder)
            if restore_epoch_end(self.train_dataloader, folder, self.global_steps):
                print(f"commrl: restored the train loader at step {self.global_steps}, an epoch's end")
            trainer = self.config.trainer
            trainer.val_before_train = bool(trainer.get("val_only", False)) or self._validation_missing()
        return out

    def _validation_missing(self) -> bool:
        """Whether the loaded step's validation was due but is not in the MLflow run (``MLFLOW_RUN_ID``,
        when verl logs to MLflow): a kill during that validation, after verl's save of the step."""
        trainer = self.config.trainer
        loggers = [trainer.logger] if isinstance(trainer.logger, str) else list(trainer.logger)
        run_id = os.environ.get("MLFLOW_RUN_ID") if "mlflow" in loggers else None
        step = self.global_steps
        missing = validation_missing(
            step, int(trainer.test_freq), self.total_training_steps, run_id, tracking.default_tracking_uri()
        )
        if missing:
            print(f"commrl: MLflow run {run_id} has no val/acc at step {step}: validating it before training")
        return missing

    def fit(self):
        with logging_method_names(after_log=self.stop_if_preempted):
            return super().fit()

    def stop_if_preempted(self, step: int) -> None:
        """After ``fit`` logged step ``step``: on a preemption request (``commrl.run.preempt``), save that
        step through verl's own checkpoint save unless verl just did, flush MLflow and raise
        ``preempt.Preempted`` out of ``fit``. The last step ends ``fit`` as usual."""
        if not preempt.requested() or step >= self.total_training_steps:
            return
        folder = Path(self.config.trainer.default_local_dir)
        if step > latest_tick(folder):  # not a save_freq step (nor the step a resume loaded)
            self._save_checkpoint()
        import mlflow

        if mlflow.active_run() is not None:  # verl's MLflow backend (attach_mlflow) logs through it
            mlflow.flush_async_logging()
        raise preempt.Preempted(latest_tick(folder), preempt.received())


@ray.remote
class CommrlTaskRunner(BaseTaskRunner):
    """verl's legacy ``TaskRunner.run`` (main_ppo_v0), building ``CommrlPPOTrainer``."""

    def run(self, config):
        from pprint import pprint

        from omegaconf import OmegaConf
        from verl.trainer.ppo.utils import (
            create_rl_dataset,
            create_rl_sampler,
            need_critic,
            need_reference_policy,
        )
        from verl.utils.config import omega_conf_to_dataclass, validate_config
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.workers.config import HFModelConfig

        print(f"CommrlTaskRunner hostname: {socket.gethostname()}, PID: {os.getpid()}")
        pprint(OmegaConf.to_container(config, resolve=True))
        OmegaConf.resolve(config)
        _, ray_worker_group_cls = self.add_actor_rollout_worker(config)
        self.add_critic_worker(config)
        self.add_reward_model_resource_pool(config)
        self.add_teacher_model_resource_pool(config)
        validate_config(
            config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
        )
        model_config: HFModelConfig = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        tokenizer, processor = model_config.tokenizer, model_config.processor
        resource_pool_manager = self.init_resource_pool_mgr(config)
        train_dataset = create_rl_dataset(
            config.data.train_files,
            config.data,
            tokenizer,
            processor,
            is_train=True,
            max_samples=config.data.get("train_max_samples", -1),
        )
        val_dataset = create_rl_dataset(
            config.data.val_files,
            config.data,
            tokenizer,
            processor,
            is_train=False,
            max_samples=config.data.get("val_max_samples", -1),
        )
        trainer = CommrlPPOTrainer(
            config=config,
            tokenizer=tokenizer,
            processor=processor,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=resource_pool_manager,
            ray_worker_group_cls=ray_worker_group_cls,
            train_dataset=train_dataset,
            val_dataset=val_dataset,
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train_dataset),
        )
        with preempt.watch() as watching:
            if not watching:
                print("commrl: not on the main thread: SIGUSR1/SIGTERM will not checkpoint", file=sys.stderr)
            trainer.init_workers()
            trainer.fit()
