"""lm-eval's ``vllm`` backend on CPU: the distribution alias and the CPU environment."""

from __future__ import annotations

import importlib.metadata
import os

import pytest

from commrl.eval import EvalError, vllm_backend
from commrl.rl.vllm_env import vllm_distribution

CPU_VARS = (
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "OMP_NUM_THREADS",
    "VLLM_CPU_OMP_THREADS_BIND",
)


def test_aliased_version_answers_vllm_with_the_cpu_build():
    versions = {"vllm-cpu": "0.31.0", "torch": "2.13.0"}
    version = vllm_backend.aliased_version(versions.__getitem__)
    assert version("vllm") == "0.31.0+cpu" and version("VLLM") == "0.31.0+cpu"
    assert version("torch") == "2.13.0"


@pytest.mark.skipif(vllm_distribution() != "vllm-cpu", reason="needs the vllm-cpu distribution without vllm")
def test_alias_is_installed_only_for_vllm_cpu(monkeypatch):
    unaliased = getattr(importlib.metadata.version, "__wrapped__", importlib.metadata.version)
    monkeypatch.setattr(importlib.metadata, "version", unaliased)  # restored after the test
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")
    assert vllm_backend.alias_vllm_cpu() is True
    assert importlib.metadata.version("vllm") == importlib.metadata.version("vllm-cpu") + "+cpu"
    assert importlib.metadata.version("lm_eval") == "0.4.13"
    assert vllm_backend.alias_vllm_cpu() is True  # idempotent: no second wrapper
    assert importlib.metadata.version("vllm").count("+cpu") == 1
    assert importlib.metadata.version.__wrapped__ is unaliased


@pytest.mark.skipif(vllm_distribution() != "vllm-cpu", reason="needs the vllm-cpu distribution without vllm")
def test_prepare_sets_the_cpu_variables_and_keeps_existing_ones(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", importlib.metadata.version)
    for name in CPU_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    vllm_backend.prepare_vllm()
    assert [os.environ[name] for name in CPU_VARS] == ["3", "0", "2", "nobind"]


def test_missing_vllm_is_a_clear_error(monkeypatch):
    """No vLLM distribution is simulated (both are installed here)."""
    monkeypatch.setattr(vllm_backend, "vllm_distribution", lambda: None)
    with pytest.raises(EvalError, match=r"--backend vllm needs vLLM.*vllm-cpu.*--backend hf"):
        vllm_backend.prepare_vllm()
