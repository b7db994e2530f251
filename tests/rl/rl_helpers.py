"""Helpers of the local-driver tests."""

from __future__ import annotations

from pathlib import Path

from commrl.models.tiny import TinyModelShape

SMALL_SHAPE = TinyModelShape(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128
)


def overrides(model: Path, data: Path, out: Path, uri: str, *extra: str) -> list[str]:
    """A short, fast run: 4 prompts x 4 samples, hf sampler, 2 mini-batches."""
    return [
        f"model.path={model}",
        f"data.dir={data}",
        f"out_dir={out}",
        f"tracking.uri={uri}",
        "sampler.backend=hf",
        "sampler.max_new_tokens=8",
        "data.val_limit=8",
        "rl.prompts_per_tick=4",
        "rl.group_size=4",
        "rl.mini_batches=2",
        "rl.micro_batch_size=4",
        "rl.ticks=4",
        "rl.read_at=4",
        "rl.val_every=2",
        "checkpoint.every=2",
        "method.rank=4",
        "method.cadence=2",
        "threads=1",
        *extra,
    ]
