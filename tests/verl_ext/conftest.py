"""Fixtures of the cluster driver's tests: verl's real worker on CPU (verl_cpu_harness) and the tiny model."""

from __future__ import annotations

import pytest
import torch
import verl_cpu_harness as harness

from commrl.compression import MethodConfig
from commrl.verl_ext.config import METHOD_ENV, method_to_env


@pytest.fixture(scope="module")
def cpu_verl(tmp_path_factory):
    """verl on CPU in a one-rank gloo world for the module's tests; the harness module."""
    torch.set_num_threads(1)
    with harness.cpu_world(tmp_path_factory.mktemp("gloo") / "store"):
        yield harness


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """commrl's tiny Qwen2 (hidden 64, 2 heads of 32, 2 layers) saved as an HF folder."""
    return harness.build_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def method(monkeypatch):
    """``method(**fields)`` sets ``COMMRL_METHOD`` for the workers built next (rank 8 < hidden 64)."""

    def set_method(**fields) -> MethodConfig:
        cfg = MethodConfig(**{"rank": 8, **fields})
        monkeypatch.setenv(METHOD_ENV, method_to_env(cfg))
        return cfg

    return set_method
