"""commrl.verl_ext.stops: the rollout stops at the end of the chat template's assistant turn.

A base model whose files list ``<|endoftext|>`` as EOS (Qwen2.5's base models) under a chat template that
ends a turn with ``<|im_end|>`` is built here from the tiny model (no hub); vLLM's own generation-config
reader and ``SamplingParams`` say where it stops, and the paper pair's resolved config carries the fix to
verl's rollout config.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_verl_config import resolve

from commrl.verl_ext import stops

END_OF_TEXT, IM_END = 0, 2  # commrl.models.tiny.SPECIAL_TOKENS


@pytest.fixture
def base_like(tiny_model_dir, tmp_path) -> Path:
    """The tiny model with a base model's files: EOS <|endoftext|> in the tokenizer and both configs."""
    from transformers import AutoTokenizer

    model = tmp_path / "base"
    shutil.copytree(tiny_model_dir, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.eos_token = "<|endoftext|>"
    tokenizer.save_pretrained(model)
    for name in ("config.json", "generation_config.json"):
        values = json.loads((model / name).read_text())
        values["eos_token_id"] = END_OF_TEXT
        (model / name).write_text(json.dumps(values))
    return model


def vllm_stops(folder: Path, tokenizer_eos: int) -> set[int]:
    """What vLLM stops at with ``generation_config=folder``: its reader and ``SamplingParams``' update."""
    from vllm import SamplingParams
    from vllm.transformers_utils.config import try_get_generation_config

    params = SamplingParams()
    params.update_from_generation_config(
        try_get_generation_config(str(folder), trust_remote_code=False).to_diff_dict(), tokenizer_eos
    )
    return set(params.stop_token_ids) | {tokenizer_eos}


def test_a_model_that_stops_at_its_turns_end_is_left_alone(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    assert stops.end_of_turn(AutoTokenizer.from_pretrained(tiny_model_dir)) == IM_END
    assert stops.rollout_generation_config(str(tiny_model_dir), tmp_path) is None
    assert not (tmp_path / stops.GENERATION_CONFIG_DIR).exists()


def test_a_base_model_gets_a_generation_config_that_stops_at_the_turns_end(base_like, tmp_path):
    assert IM_END not in vllm_stops(base_like, END_OF_TEXT)  # the model's own files: runs past its turn
    folder, token = stops.rollout_generation_config(str(base_like), tmp_path / "run")
    assert token == IM_END and folder == tmp_path / "run" / stops.GENERATION_CONFIG_DIR
    assert vllm_stops(folder, END_OF_TEXT) == {END_OF_TEXT, IM_END}


def test_verl_train_hands_it_to_verls_rollout(base_like, tmp_path):
    """The paper pair's resolved config, as `commrl verl-train` passes it: verl's rollout dataclass gets
    vLLM's ``generation_config`` engine argument."""
    from verl.utils.config import omega_conf_to_dataclass

    from commrl.cli.verl_train import rollout_stops

    _, cfg = resolve("A", "method", extra=[f"actor_rollout_ref.model.path={base_like}"])
    rollout_stops(cfg, tmp_path)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert rollout.engine_kwargs["vllm"]["generation_config"] == str(tmp_path / stops.GENERATION_CONFIG_DIR)


def test_an_unreadable_tokenizer_is_a_warning_not_a_failure(tmp_path, capsys):
    from commrl.cli.verl_train import rollout_stops

    _, cfg = resolve("A", "method", extra=[f"actor_rollout_ref.model.path={tmp_path / 'absent'}"])
    rollout_stops(cfg, tmp_path)
    assert "could not read" in capsys.readouterr().err
    assert "generation_config" not in cfg.actor_rollout_ref.rollout.engine_kwargs.vllm
