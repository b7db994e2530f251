"""The paper pair's resolved run config builds verl's real workers (verl_cpu_harness.paper_config).

The config is pair A's as ``commrl verl-train --dry-run`` resolves it, with only the device's differences
overridden (the tiny model, fp32, no torch.compile, batch shapes): a recipe that cannot load a model on the
GPU environment (envs/train-gpu.yaml) fails here first.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
ATTN_KEY = "actor_rollout_ref.model.override_config.attn_implementation"


def rollout_model_config(model_cfg):
    """The model config the rollout side builds (``vllm_async_server``: ``omega_conf_to_dataclass``)."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    return omega_conf_to_dataclass(model_cfg, dataclass_type=HFModelConfig)


def test_pair_a_builds_actor_and_ref_with_its_attention(cpu_verl, tiny_model_dir):
    """The recipe's sdpa reaches the actor, the reference and the rollout's model config; under it the
    recipe's packed inputs (use_remove_padding, dynamic micro-batches) give the padded layout's log-probs."""
    arr = cpu_verl.paper_config(tiny_model_dir).actor_rollout_ref
    assert arr.model.override_config.attn_implementation == "sdpa"
    assert arr.model.use_remove_padding and arr.actor.use_dynamic_bsz and arr.actor.strategy == "fsdp2"
    assert arr.model.enable_gradient_checkpointing
    actor, ref = (cpu_verl.build_worker(arr, role, "stock") for role in ("actor", "ref"))
    for worker in (actor, ref):
        assert cpu_verl.engine_of(worker).module.config._attn_implementation == "sdpa"
    assert rollout_model_config(arr.model).hf_config._attn_implementation == "sdpa"

    padded_cfg = cpu_verl.paper_config(
        tiny_model_dir, extra=("actor_rollout_ref.model.use_remove_padding=False",)
    ).actor_rollout_ref
    padded = cpu_verl.build_worker(padded_cfg, "actor", "stock")
    batch = cpu_verl.training_batch(actor)
    mask = batch.batch["response_mask"].bool()
    packed_lp, padded_lp = cpu_verl.log_probs(actor, batch), cpu_verl.log_probs(padded, batch)
    torch.testing.assert_close(packed_lp[mask], padded_lp[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("condition", ["method", "dropout"])  # dropout adds its own HF override
def test_both_pairs_choose_sdpa_in_every_condition(cpu_verl, tiny_model_dir, condition):
    for pair in ("A", "B"):
        arr = cpu_verl.paper_config(tiny_model_dir, pair=pair, condition=condition).actor_rollout_ref
        assert arr.model.override_config.attn_implementation == "sdpa", (pair, condition)


def test_without_the_setting_verl_asks_for_flash_attention_2(cpu_verl, tiny_model_dir):
    """The control: without the recipe's setting verl asks for flash_attention_2, which neither this
    environment nor envs/train-gpu.yaml installs, and the first model build fails."""
    assert importlib.util.find_spec("flash_attn") is None
    assert "flash" not in (REPO / "envs" / "train-gpu.yaml").read_text()
    arr = cpu_verl.paper_config(tiny_model_dir, extra=(f"~{ATTN_KEY}",)).actor_rollout_ref
    assert "attn_implementation" not in arr.model.override_config
    assert rollout_model_config(arr.model).hf_config._attn_implementation == "flash_attention_2"
    with pytest.raises(ImportError, match="FlashAttention2"):
        cpu_verl.build_worker(arr, "ref", "stock")
