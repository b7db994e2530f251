"""Training through the fork server (``commrl.run.forkserver``), as ``make pipeline`` runs every job: the
same run bit for bit as in its own process; a preemption warning sent to the client checkpoints the fork
(exit 75) and the rerun resumes; a client killed outright takes its fork with it, and a fork killed by a
signal kills its client with the same signal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from forkserver_helpers import Server, direct_env, forks_of
from rl_helpers import overrides

from commrl.run import preempt

PRELOAD = ("commrl.rl.trainer", "commrl.cli.train", "verl.trainer.ppo.core_algos")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server(PRELOAD)
    yield srv
    srv.stop()


def start_train(out: Path, env: dict[str, str], model: Path, data: Path, ticks: int) -> subprocess.Popen:
    args = overrides(model, data, out, f"sqlite:///{out.parent / (out.name + '.db')}", "condition=method")
    args += [f"rl.ticks={ticks}", f"rl.read_at={ticks}"]
    log = open(out.parent / f"{out.name}.log", "a")  # noqa: SIM115 - the child holds its own copy
    with log:
        return subprocess.Popen(
            [sys.executable, "-m", "commrl.cli.main", "train", *args],
            env={**env, "COMMRL_NO_PROGRESS": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def first_checkpoint(out: Path) -> bool:
    return any((out / "checkpoints").glob("*")) if (out / "checkpoints").is_dir() else False


def rows(out: Path) -> list[dict]:
    """The metrics table less the wall-clock columns."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in lines]


def test_a_preempted_run_through_the_server_equals_the_run_in_its_own_process(
    server, tmp_path, small_model, toy_data
):
    ticks = 24
    alone = tmp_path / "alone"
    assert start_train(alone, direct_env(), small_model, toy_data, ticks).wait(timeout=600) == 0

    forked = tmp_path / "forked"
    client = start_train(forked, server.env(), small_model, toy_data, ticks)
    wait_for(lambda: first_checkpoint(forked))
    client.send_signal(signal.SIGUSR1)  # the preemption warning, to the client: forwarded to the fork
    assert client.wait(timeout=120) == preempt.EXIT_PREEMPTED, (forked.parent / "forked.log").read_text()
    assert not (forked / "final").exists()
    assert start_train(forked, server.env(), small_model, toy_data, ticks).wait(timeout=600) == 0

    assert rows(forked) == rows(alone)
    weights = "final/model.safetensors"
    assert (forked / weights).read_bytes() == (alone / weights).read_bytes()


def test_a_client_killed_outright_takes_its_fork_with_it(server, tmp_path, small_model, toy_data):
    out = tmp_path / "run"
    client = start_train(out, server.env(), small_model, toy_data, ticks=400)
    wait_for(lambda: first_checkpoint(out))
    (fork,) = forks_of(server)
    client.kill()
    client.wait()
    wait_for(lambda: not Path(f"/proc/{fork}").exists(), timeout=10)  # killed and reaped by the server


def test_a_fork_killed_by_a_signal_kills_its_client_with_that_signal(server, tmp_path, small_model, toy_data):
    out = tmp_path / "run"
    client = start_train(out, server.env(), small_model, toy_data, ticks=400)
    wait_for(lambda: first_checkpoint(out))
    (fork,) = forks_of(server)
    os.kill(fork, signal.SIGKILL)  # the kernel's OOM killer, say
    assert client.wait(timeout=30) == -signal.SIGKILL
