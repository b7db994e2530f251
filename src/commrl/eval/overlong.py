"""Prompts longer than the context leaves them: lm-eval cuts such a prompt from the left (the chat header, the
system prompt and the start of the problem go) and only logs a warning. Every evaluation counts them, from
the exact contexts it sent (the per-sample log), and says so when any was cut.

A generated answer's context may hold ``max_model_len - max_gen_toks`` tokens (lm-eval's ``generate_until``
keeps the last ones); a multiple-choice option's context and continuation together ``max_model_len``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def prompt_lengths(sample: Mapping[str, Any], tokenizer, generative: bool) -> list[int]:
    """Token counts of a sample's requests: each context (``generative``), else context + continuation."""
    counts = []
    for request in sample.get("arguments") or []:
        texts: Sequence[str] = request[:1] if generative else request[:2]
        counts.append(sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts))
    return counts


def count_overlong(
    samples: Mapping[str, list[Mapping[str, Any]]],
    tokenizer,
    max_model_len: int,
    max_gen_toks: int | None,
) -> int:
    """Problems with a request past its budget (``max_gen_toks`` None: multiple choice)."""
    generative = max_gen_toks is not None
    budget = max_model_len - (max_gen_toks or 0)
    return sum(
        any(n > budget for n in prompt_lengths(sample, tokenizer, generative))
        for task_samples in samples.values()
        for sample in task_samples
    )


def checkpoint_tokenizer(checkpoint: Path):
    """The checkpoint's tokenizer, or None where it has none (an injected test model); loaded once per
    process for all the benchmarks of one checkpoint (again if its tokenizer files change)."""
    config = checkpoint / "tokenizer_config.json"
    if not config.is_file():
        return None
    stamp = tuple(f.stat().st_mtime_ns for f in (config, checkpoint / "tokenizer.json") if f.is_file())
    return _load_tokenizer(str(checkpoint.resolve()), stamp)


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str, _stamp: tuple[int, ...]):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def warning(benchmark: str, n: int, n_docs: int | None, max_model_len: int) -> str:
    return (
        f"warning: {benchmark}: {n} of {n_docs} prompts exceed the context (max_model_len {max_model_len} "
        "less the response budget) and were cut from the left by lm-eval; their scores are of the cut "
        "prompts. Raise the pair's max_model_len or drop those problems"
    )
