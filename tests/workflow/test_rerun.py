"""What a change plans again: a finished pipeline, each of its jobs run for real by Snakemake with a stand-in
for `commrl` (commrl_stub.py: it writes the declared outputs, so Snakemake records every job's params,
inputs and code as for a real run), then a dry-run after one change. A change must plan the jobs that read
what changed, and only those."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from snakemake_run import Result, Workflow

STUB = Path(__file__).with_name("commrl_stub.py")
CONFIG = "configs/pipeline/world.yaml"


class StubWorkflow(Workflow):
    """A workflow copy whose jobs find the stand-in first on PATH (in <root>/stub/)."""

    @classmethod
    def at(cls, root: Path) -> StubWorkflow:
        """The copy already at `root` (made by the constructor, then copied whole with its results)."""
        found = cls.__new__(cls)
        found.root, found.configfile = root, None
        return found

    def install_stub(self) -> None:
        bin_dir = self.root / "stub"
        bin_dir.mkdir()
        script = bin_dir / "commrl"
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" "$@"\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)

    def env(self) -> dict[str, str]:
        env = super().env()
        env["PATH"] = f"{self.root / 'stub'}{os.pathsep}{env['PATH']}"
        return env

    def plan(self, config: str = CONFIG) -> Result:
        """The dry-run of the default target, with the shell commands and the reasons."""
        return self.dry_run("-p", "--configfile", config)


def _small(config: dict) -> dict:
    """The tiny config cut to a few jobs: dense and method, seed 0, one benchmark of method, the sweep."""
    tiny = config["pairs"]["tiny"]
    tiny.update(conditions=["dense", "method"], seeds=[0])
    tiny["eval"].update(
        conditions=["method"], benchmarks={"toy_greedy": tiny["eval"]["benchmarks"]["toy_greedy"]}
    )
    return config


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the workflow whose small pipeline (_small) ran to the end."""
    workflow = StubWorkflow(tmp_path_factory.mktemp("finished"))
    workflow.install_stub()
    workflow.write_config(_small(workflow.config()), Path(CONFIG).name)
    run = workflow.snakemake("--cores", "2", "--configfile", CONFIG)
    assert run.returncode == 0, run.output[-3000:]
    assert "Nothing to be done" in workflow.plan().output
    return workflow.root


@pytest.fixture
def world(finished: Path, tmp_path: Path) -> StubWorkflow:
    """A copy of the finished pipeline of its own (outputs, times and Snakemake's records), to change."""
    root = tmp_path / "world"
    shutil.copytree(finished, root, symlinks=True)
    return StubWorkflow.at(root)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, path
    path.write_text(text.replace(old, new))


def test_a_hangup_stops_snakemake_gracefully_and_leaves_no_lock(tmp_path: Path) -> None:
    """A closed terminal sends SIGHUP, of which Snakemake dies at once, its lock left behind (the next
    `make pipeline` would refuse to start until --unlock). The workflow turns it into Snakemake's graceful
    SIGTERM: the running training job finishes, the lock is released, and the same command goes on."""
    (tmp_path / "w").mkdir()
    workflow = StubWorkflow(tmp_path / "w")
    workflow.install_stub()
    workflow.write_config(_small(workflow.config()), Path(CONFIG).name)
    mark = tmp_path / "train-started"
    env = workflow.env() | {"COMMRL_STUB_TRAIN_S": "3", "COMMRL_STUB_MARK": str(mark)}
    target = "results/runs/tiny/dense/seed0/summary.json"
    cmd = [sys.executable, "-m", "snakemake", target, "--cores", "1", "--configfile", CONFIG]
    proc = subprocess.Popen(cmd, cwd=workflow.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mark.exists(), proc.communicate()[0].decode()[-3000:]
    proc.send_signal(signal.SIGHUP)
    output = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode != -signal.SIGHUP, output[-3000:]
    assert not list((workflow.root / ".snakemake" / "locks").glob("*")), output[-3000:]
    rerun = workflow.snakemake(target, "--cores", "1", "--configfile", CONFIG)
    assert rerun.returncode == 0, rerun.output[-3000:]


def test_a_finished_copy_plans_nothing(world: StubWorkflow) -> None:
    assert "Nothing to be done" in world.plan().output


def _add_second_pair(world: StubWorkflow) -> str:
    """configs/pipeline/two-pairs.yaml: the config and pair tiny2 (tiny's pair file; dense, no sweep)."""
    train = world.root / "configs" / "train" / "pair"
    shutil.copy(train / "tiny.yaml", train / "tiny2.yaml")
    config = world.config(CONFIG)
    second = {key: value for key, value in config["pairs"]["tiny"].items() if key != "sweep"}
    config["pairs"]["tiny2"] = {
        **second,
        "conditions": ["dense"],
        "eval": {**second["eval"], "conditions": ["dense"]},
    }
    return world.write_config(config, "two-pairs.yaml")


def test_a_pair_added_to_the_config_plans_its_jobs_alone(world: StubWorkflow) -> None:
    """A second pair (its own experiment and stamp: workflow/rules/init.smk) leaves the first pair's jobs,
    and the MLflow store's, alone: only its chain and the report are planned."""
    result = world.plan(_add_second_pair(world))
    assert result.counts() == {
        "init_pair": 1,
        "pretrain": 1,
        "train_local": 1,
        "eval_tiny2": 1,
        "report": 1,
        "all": 1,
    }, result.output[-3000:]
    assert "commrl init-store --pair tiny2 --stamp results/.init/pairs/tiny2.done" in result.output
    assert "results/runs/tiny/" not in "".join(
        line for line in result.output.splitlines() if line.startswith("    output: ")
    )


def test_switching_back_to_a_config_without_a_pair_plans_the_report_alone(world: StubWorkflow) -> None:
    """Switching configs in one checkout (tiny.yaml and paper.yaml, or a copy with a pair more) reruns none
    of the jobs both configs share: here a run with a second pair, then the first config again."""
    _add_second_pair(world)
    run = world.snakemake("--cores", "2", "--configfile", "configs/pipeline/two-pairs.yaml")
    assert run.returncode == 0, run.output[-3000:]
    result = world.plan()
    assert result.counts() == {"report": 1, "all": 1}, result.output[
        -3000:
    ]  # its inputs are one pair's again


@pytest.mark.parametrize(
    ("path", "old", "new", "runs"),
    [
        ("configs/condition/method.yaml", "projection: secant", "projection: none", ["method"]),
        ("configs/train/pair/tiny.yaml", "rank: 6", "rank: 8", ["dense", "method"]),
        ("configs/train/config.yaml", "threads: 0", "threads: 0  # changed", ["dense", "method"]),
    ],
    ids=["condition", "pair", "driver"],
)
def test_a_changed_run_config_plans_its_training_runs_again(
    world: StubWorkflow, path: str, old: str, new: str, runs: list[str]
) -> None:
    """The config files a training run composes through Hydra are its job's inputs: the condition's file,
    the local driver's config.yaml and pair file. The sweep's trials compose them too (method's sweep)."""
    _edit(world.root / path, old, new)
    result = world.plan()
    planned = sorted(
        line.split("condition=")[1].split(",")[0]
        for line in result.output.splitlines()
        if line.startswith("    wildcards: pair=tiny, condition=")
    )
    assert planned == sorted(runs), result.output[-3000:]
    assert f"Updated input files: {path}" in result.output
    assert result.counts()["train_local"] == len(runs)
    assert result.counts()["sweep_worker"] == 2  # the sweep's condition is method


def test_a_changed_network_model_config_plans_the_report(world: StubWorkflow) -> None:
    """The report draws every configs/netmodel/pair_*.yaml, pair A's too on the tiny config."""
    path = world.root / "configs" / "netmodel" / "pair_A.yaml"
    path.write_text(path.read_text() + "# changed\n")
    result = world.plan()
    assert result.counts() == {"report": 1, "all": 1}, result.output[-3000:]
    assert "Updated input files: configs/netmodel/pair_A.yaml" in result.output
