"""Fixtures of the local-driver tests: a small toy dataset and a small random Qwen2 policy on disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rl_helpers import SMALL_SHAPE

from commrl.models.tiny import build_char_tokenizer, build_tiny_model, save_model_dir


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "toy"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "commrl.cli.main",
            "prepare",
            "--dataset",
            "toy",
            "--out",
            str(out),
            "--n-train",
            "200",
            "--n-val",
            "16",
            "--n-test",
            "16",
            "--seed",
            "0",
        ],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="session")
def small_model(tmp_path_factory) -> Path:
    """A random-weight policy (the mechanics tests need no skill); head size 32 so vLLM accepts it."""
    out = tmp_path_factory.mktemp("models") / "small"
    tok = build_char_tokenizer()
    save_model_dir(build_tiny_model(SMALL_SHAPE, tok, seed=0), tok, out)
    return out
