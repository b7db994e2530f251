"""Fixtures of the evaluation tests: toy problems, a tiny random model, an MLflow store with a training run.

The hub cannot be reached here, so the tests run offline (set before ``datasets`` is imported): a hub
dataset that is not cached fails at once instead of after ~25 s of retries.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))

import pytest
import torch
from eval_data import toy_rows, write_jsonl

from commrl import tracking
from commrl.models.tiny import TinyModelShape, build_char_tokenizer, build_tiny_model, save_model_dir

ASCII_OUTPUT = "0123456789+-=\\{}boxed "
HEAD_SCALE = 50.0


@pytest.fixture
def toy_jsonl(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "test.jsonl", toy_rows(6))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The tiny Qwen2 model with random weights, its output head limited to printable ASCII and EOS.

    A random head emits byte sequences that are not UTF-8; HF and vLLM render those differently (U+FFFD
    against holding the bytes back), which would hide whether the two backends chose the same tokens.
    Zeroing the other rows of the head and scaling the kept ones keeps the model random but its text
    printable, with clear gaps between the top logits.
    """
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyModelShape(), tokenizer, seed=0)
    keep = [tokenizer.convert_tokens_to_ids(t) for t in tokenizer.tokenize(ASCII_OUTPUT)]
    keep.append(tokenizer.eos_token_id)
    with torch.no_grad():
        head = model.lm_head.weight
        kept = head[keep].clone() * HEAD_SCALE
        head.zero_()
        head[keep] = kept
    return save_model_dir(model, tokenizer, tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    """A real sqlite MLflow store, one per test module (creating one costs seconds)."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    return tracking.init_store([tracking.experiment_name("tiny")], tracking_uri=uri)


@pytest.fixture
def training_run(mlflow_uri: str) -> str:
    """A finished training run of the tiny pair to nest evaluations under; its run id."""
    c = tracking.client(mlflow_uri)
    exp_id = tracking.ensure_experiment(tracking.experiment_name("tiny"), mlflow_uri, c)
    tags = {"kind": "train", "pair": "tiny", "condition": "method", "seed": "0", "codec": "lowrank"}
    run = c.create_run(exp_id, run_name=tracking.training_run_name("tiny", "method", 0), tags=tags)
    c.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id
