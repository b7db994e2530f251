"""Fixtures of the local-driver tests: a small toy dataset and a small random Qwen2 policy on disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from commrl.models.tiny import TinyModelShape, build_char_tokenizer, build_tiny_model, save_model_dir

SMALL_SHAPE = TinyModelShape(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128
)


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "toy"
    subprocess.run(
        [sys.executable, "-m", "commrl.cli.main", "prepare", "--dataset", "toy", "--out", str(out),
         "--n-train", "200", "--n-val", "16", "--n-test", "16", "--seed", "0"],
        check=True, capture_output=True,
    )
    return out


@pytest.fixture(scope="session")
def small_model(tmp_path_factory) -> Path:
    """A random-weight policy (the mechanics tests need no skill); head size 32 so vLLM accepts it."""
    out = tmp_path_factory.mktemp("models") / "small"
    tok = build_char_tokenizer()
    save_model_dir(build_tiny_model(SMALL_SHAPE, tok, seed=0), tok, out)
    return out


def overrides(model: Path, data: Path, out: Path, uri: str, *extra: str) -> list[str]:
    """A short, fast run: 4 prompts x 4 samples, hf sampler, 2 mini-batches."""
    return [
        f"model.path={model}", f"data.dir={data}", f"out_dir={out}", f"tracking.uri={uri}",
        "sampler.backend=hf", "sampler.max_new_tokens=8", "data.val_limit=8",
        "rl.prompts_per_tick=4", "rl.group_size=4", "rl.mini_batches=2", "rl.micro_batch_size=4",
        "rl.ticks=4", "rl.read_at=4", "rl.val_every=2", "checkpoint.every=2", "method.rank=4", "method.cadence=2",
        "threads=1", *extra,
    ]
