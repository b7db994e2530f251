"""Where a rollout stops: at the end of the chat template's assistant turn, whatever the model's files list.

verl's vLLM rollout passes no stop tokens of its own: vLLM stops at the tokenizer's EOS and at the
``eos_token_id`` of the model's generation config. A base model trained with a chat template may list
neither at the token that ends the template's assistant turn (Qwen2.5's base models list ``<|endoftext|>``,
while the template ends a turn with ``<|im_end|>``); its responses then run past the turn into an invented
next one, to the length limit, and the last ``\\boxed{}`` of that text is what the reward scores.

``rollout_generation_config`` checks the model's files and, where the end-of-turn token is missing, writes
a copy of its generation config that adds it (``<out>/generation_config/generation_config.json``), for
vLLM's ``generation_config`` engine argument (``actor_rollout_ref.rollout.engine_kwargs.vllm``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

GENERATION_CONFIG_DIR = "generation_config"
ENGINE_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.generation_config"
_PROBE = "commrl-end-of-turn-probe"


def end_of_turn(tokenizer: Any) -> int | None:
    """The special token the chat template writes right after an assistant message, or None (no template,
    or none there)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": _PROBE}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    if _PROBE not in text:
        return None
    after = tokenizer.encode(text[text.index(_PROBE) + len(_PROBE) :], add_special_tokens=False)
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    return after[0] if after and after[0] in special else None


def stop_ids(tokenizer: Any, generation: Any) -> set[int]:
    """The token ids vLLM stops at: the tokenizer's EOS and the generation config's ``eos_token_id``."""
    eos = generation.eos_token_id
    ids = set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))
    return ids | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())


def model_generation_config(model_path: str) -> Any:
    """The model's generation config as vLLM reads it: ``generation_config.json``, else the model config's."""
    from transformers import AutoConfig, GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_path)
    except OSError:
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_path))


def rollout_generation_config(model_path: str, out_dir: Path) -> tuple[Path, int] | None:
    """``(folder, token)``: the generation config written under ``out_dir`` with the end-of-turn ``token``
    added to ``eos_token_id``, when the model's files do not stop there; None when they do."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    token = end_of_turn(tokenizer)
    generation = model_generation_config(model_path)
    stops = stop_ids(tokenizer, generation)
    if token is None or token in stops:
        return None
    generation.eos_token_id = sorted(stops | {token})
    folder = Path(out_dir) / GENERATION_CONFIG_DIR
    generation.save_pretrained(folder)
    return folder, token
