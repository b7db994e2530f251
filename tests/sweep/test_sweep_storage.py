"""Concurrent workers on one storage change each trial's state once. Optuna's ``SELECT ... FOR UPDATE`` is
a no-op on sqlite: without ``SQLiteStorage``'s file lock both workers of a real tiny sweep ran the
enqueued defaults, and two reapers could both fail a stale trial and enqueue two retries."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from commrl.sweep.config import HeartbeatConfig, StorageSpec
from commrl.sweep.storage import SQLiteStorage, open_storage

CLAIM = Path(__file__).resolve().parent / "sweep_claim.py"
N = 150


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
@pytest.mark.parametrize("action", ["claim", "fail"])
@pytest.mark.parametrize("location", ["sqlite", "journal"])
def test_two_processes_change_each_trial_once(tmp_path, location, action):
    url = f"sqlite:///{tmp_path / 'race.db'}" if location == "sqlite" else str(tmp_path / "race.journal")
    storage = open_storage(StorageSpec.parse(url), HeartbeatConfig(), create_dirs=True)
    assert isinstance(storage, SQLiteStorage) == (location == "sqlite")
    study = optuna.create_study(study_name="race", storage=storage)
    for k in range(N):
        study.enqueue_trial({"x": float(k)})
    if action == "fail":  # N RUNNING trials, as left behind by dead workers
        for _ in range(N):
            study.ask()
    start_at = time.time() + 8  # both processes are up by then and start at the same instant
    procs = [
        subprocess.Popen(
            [sys.executable, str(CLAIM), url, str(tmp_path / f"{w}.json"), str(start_at), action]
        )
        for w in (0, 1)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    first, second = (set(json.loads((tmp_path / f"{w}.json").read_text())) for w in (0, 1))
    assert not first & second
    assert len(first | second) == N
