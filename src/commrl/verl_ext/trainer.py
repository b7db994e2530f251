"""verl's PPO trainer (the legacy ``RayPPOTrainer``) with commrl's read-outs, and the TaskRunner building it.

verl 0.9.1's default trainer (``trainer.use_v1=true``) needs the TransferQueue package (``verl[verl-core]``),
so ``commrl verl-train`` runs the legacy trainer (``trainer.use_v1=false``) through ``main_ppo.run_ppo`` with
``CommrlTaskRunner``, the recipe hook verl documents ("For recipe to change TaskRunner").

What it adds to verl's metrics (nothing is renamed away; verl's own names stay):

- ``mismatch/*`` (method.md §4) from the sampler's ``rollout_log_probs`` against the trainer's
  ``old_log_probs`` -- verl's own ``training/rollout_probs_diff_*`` and
  ``training/rollout_actor_probs_pearson_corr`` compare *probabilities*; §4 correlates *log-probs*;
- the method.md §4 names of what verl logs under its own names (``method_metrics``): ``score/mean``,
  ``comm/*`` and ``anchor/*`` (the engine's, logged by verl as ``actor/comm/...``), ``val/acc``,
  ``time/step_s``, ``time/sample_s``, ``time/train_s``.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import ray
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from commrl.rl.mismatch import mismatch_metrics

ALIASES = {
    "critic/score/mean": "score/mean",
    "timing_s/step": "time/step_s",
    "timing_s/gen": "time/sample_s",
    "timing_s/update_actor": "time/train_s",
}
ENGINE_PREFIXES = ("comm/", "anchor/")
VAL_ACC = re.compile(r"val-core/[^/]+/acc/mean@\d+")


def method_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The method.md §4 names of verl's metrics of one step (to log beside verl's own).

    ``val/acc`` is the mean over the validation data sources of verl's core ``acc/mean@N``.
    """
    out = {name: float(metrics[key]) for key, name in ALIASES.items() if key in metrics}
    for key, value in metrics.items():
        short = key.removeprefix("actor/")
        if short != key and short.startswith(ENGINE_PREFIXES):
            out[short] = float(value)
    accs = [float(value) for key, value in metrics.items() if VAL_ACC.fullmatch(key)]
    if accs:
        out["val/acc"] = sum(accs) / len(accs)
    return out


@contextmanager
def logging_method_names() -> Iterator[None]:
    """While active, every ``verl.utils.tracking.Tracking`` logs ``method_metrics`` beside verl's names.

    ``RayPPOTrainer.fit`` builds its ``Tracking`` inside and offers no hook on what it logs, so the class is
    swapped for a subclass in this process for the duration of ``fit``.
    """
    import verl.utils.tracking as verl_tracking

    stock = verl_tracking.Tracking

    class MethodNamesTracking(stock):
        def log(self, data, step, backend=None):
            super().log({**data, **method_metrics(data)}, step, backend)

    verl_tracking.Tracking = MethodNamesTracking
    try:
        yield
    finally:
        verl_tracking.Tracking = stock


def batch_mismatch(batch) -> dict[str, float]:
    """``mismatch/*`` of a trainer step's ``DataProto``: the sampler's ``rollout_log_probs`` against the
    trainer's ``old_log_probs`` on the response tokens; empty when the sampler recorded none."""
    tensors = batch.batch
    if "rollout_log_probs" not in tensors.keys():  # noqa: SIM118  (a TensorDict)
        return {}
    return mismatch_metrics(tensors["rollout_log_probs"], tensors["old_log_probs"], tensors["response_mask"])


class CommrlPPOTrainer(RayPPOTrainer):
    """``RayPPOTrainer`` that logs ``mismatch/*`` and the method.md §4 names."""

    def _update_actor(self, batch):
        output = super()._update_actor(batch)
        output.meta_info["metrics"].update(batch_mismatch(batch))
        return output

    def fit(self):
        with logging_method_names():
            return super().fit()


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
        trainer.init_workers()
        trainer.fit()
