"""Shared fixtures of the sweep tests: a real MLflow sqlite store, sweep configs in a tmp folder, and the tiny
world the real trainer reads (toy data and an untrained tiny model)."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from commrl import tracking
from commrl.cli.main import main

BASE = {
    "pair": "tiny",
    "condition": "method",
    "driver": "local",
    "seed": 0,
    "n_trials": 4,
    "n_workers": 2,
    "ticks": 6,
    "val_every": 2,
    "read_at": 6,
    "heartbeat": {"interval": 1, "grace": 3, "max_retry": 2},
    "sampler": {"name": "tpe", "seed": 0, "n_startup_trials": 2},
    "pruner": {"name": "none"},
    "space": {
        "rank": {"type": "int", "low": 4, "high": 32, "log": True},
        "alpha": {"type": "float", "low": 0.0, "high": 1.0},
        "beta": {"type": "float", "low": 0.0, "high": 0.9},
        "cadence": {"type": "int", "low": 2, "high": 20},
    },
    "defaults": {"rank": 6, "alpha": 0.25, "beta": 0.25, "cadence": 5},
}


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    """A real MLflow sqlite store with experiment commrl/tiny, created once (creation takes seconds)."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    tracking.init_store([tracking.experiment_name("tiny")], tracking_uri=uri)
    return uri


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    """Toy data (``commrl prepare``, small splits) and an untrained tiny Qwen2: what the trainer reads."""
    from commrl.models.tiny import TinyModelShape, build_char_tokenizer, build_tiny_model, save_model_dir

    root = tmp_path_factory.mktemp("tiny")
    assert (
        main(
            [
                "prepare",
                "--dataset",
                "toy",
                "--n-train",
                "64",
                "--n-val",
                "8",
                "--n-test",
                "8",
                "--out",
                str(root / "data"),
            ]
        )
        == 0
    )
    tokenizer = build_char_tokenizer()
    save_model_dir(build_tiny_model(TinyModelShape(), tokenizer, seed=0), tokenizer, root / "model")
    return root


@pytest.fixture
def env(tmp_path, mlflow_uri, monkeypatch) -> dict[str, str]:
    """Results under tmp_path, the shared MLflow store; the environment for subprocess workers too."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.setenv("COMMRL_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("COMMRL_NO_PROGRESS", "1")
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture
def sweep_dict(tmp_path) -> dict:
    """A valid tiny-style sweep config (fast heartbeat, sqlite storage in tmp_path) to modify per test."""
    raw = copy.deepcopy(BASE)
    raw["storage"] = f"sqlite:///{tmp_path / 'optuna' / 'tiny.db'}"
    return raw


@pytest.fixture
def write_config(tmp_path):
    """``write_config(raw, name="sweep.yaml") -> Path``: a config dict as a YAML file in tmp_path."""

    def write(raw: dict, name: str = "sweep.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return path

    return write
