"""Shared by the network-model tests: a small MLflow store with pair A's dense and method runs, filled with
the report tests' synthetic series (``tests/report/conftest.py``: val/acc, comm/* and time/* per tick)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

RUNS_CONFIG = """\
pair: A
bytes: runs
compressed: method
layout: {stages: 5, dp: 2, points: 4, collective: allreduce, micro_batches: 4}
passes: {fast: 2, fire: 3}
element_bytes: {grads: 4, params: 4}
target_fraction: 0.95
interconnects: [1GbE, 10GbE, IB-NDR]
sweep: {low_gbps: 0.1, high_gbps: 400, latency_us: 5, tolerance: 0.01}
compute_note: synthetic compute times of the report tests' store
"""


def report_series() -> ModuleType:
    """``tests/report/conftest.py`` as a plain module (its series and run helpers; its fixtures unused)."""
    path = Path(__file__).resolve().parents[1] / "report" / "conftest.py"
    spec = importlib.util.spec_from_file_location("report_synthetic_series", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def series() -> ModuleType:
    return report_series()


@pytest.fixture(scope="session")
def net_store_uri(tmp_path_factory, series) -> str:
    """A sqlite store with pair A's dense and method runs (three seeds each, read at tick 50)."""
    from commrl import tracking

    uri = f"sqlite:///{tmp_path_factory.mktemp('netstore') / 'mlflow.db'}"
    tracking.init_store(tracking_uri=uri)
    client = tracking.client(uri)
    exp = tracking.ensure_experiment(tracking.experiment_name("A"), uri, client)
    for condition in ("dense", "method"):
        for seed in series.SEEDS_A:
            runs = series.pair_a_series(condition, seed)
            series.train_run(client, exp, "A", condition, seed, runs, read_at=50)
    return uri


@pytest.fixture(scope="session")
def runs_config(tmp_path_factory) -> Path:
    """A ``bytes: runs`` network config for the store's pair A."""
    path = tmp_path_factory.mktemp("netconfig") / "pair_A_runs.yaml"
    path.write_text(RUNS_CONFIG)
    return path
