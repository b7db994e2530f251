"""The workflow through a real Slurm: scripts/local_slurm.sh starts a one-node controller on this machine
(apt-installing munge and Slurm when missing), the slurm-local profile submits every job with sbatch, and a
GPU request set per rule reaches the scheduler (two fake GPUs: character devices cloned from /dev/null).

Skipped with the reason when not root or when Slurm cannot be installed or started, unless
COMMRL_REQUIRE_SLURM=1 (CI), which turns those into failures.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from snakemake_run import REPO, Workflow

SCRIPT = REPO / "scripts" / "local_slurm.sh"
REQUIRED = os.environ.get("COMMRL_REQUIRE_SLURM") == "1"

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"COMMRL_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def local_slurm():
    """The local controller, started for these tests (and stopped after) unless it already ran."""
    if os.geteuid() != 0:
        _unavailable("the local Slurm runs its daemons as root; run the tests as root")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        _unavailable("Slurm is not installed and there is no apt-get to install it")
    was_running = subprocess.run([SCRIPT, "status"], capture_output=True, timeout=60).returncode == 0
    start = subprocess.run([SCRIPT, "start"], capture_output=True, text=True, timeout=900)
    if start.returncode != 0:
        _unavailable(f"scripts/local_slurm.sh start failed:\n{(start.stdout + start.stderr)[-2000:]}")
    yield
    if not was_running:
        subprocess.run([SCRIPT, "stop"], capture_output=True, timeout=120)
        # A config left at the default path, naming a stopped controller, makes every later `scontrol`
        # (run by the slurm executor plugin when Snakemake starts) wait ~9 s for it.
        base = os.path.realpath(os.environ.get("LOCAL_SLURM_DIR", REPO / ".local-slurm"))
        left = "/etc/slurm/slurm.conf"
        assert not (os.path.islink(left) and os.readlink(left).startswith(base)), f"stop left {left} linked"


def _run_until_done(workflow: Workflow, args: list[str], timeout: float) -> tuple[int, str]:
    """snakemake with a deadline; on expiry SIGINT (SIGTERM only makes it wait) and cancel its Slurm jobs."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", *args],
        cwd=workflow.root,
        env=workflow.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        run = re.search(r"SLURM run ID: (\S+)", out)
        if run:
            subprocess.run(["scancel", "--name", run.group(1)], capture_output=True, timeout=30)
        pytest.fail(f"snakemake through Slurm did not finish in {timeout} s:\n{out[-3000:]}")
    return proc.returncode, out


SUBSET = REPO / "tests" / "fixtures" / "pipeline" / "slurm-subset.yaml"
SUBSET_RULES = {"init_store", "prepare_toy", "pretrain", "train_local", "eval", "report"}


def test_the_pipeline_subset_runs_through_slurm_with_its_gpu_requests(
    local_slurm, workflow: Workflow
) -> None:
    """data -> base policy -> training -> evaluation -> report, every job an sbatch job (the documented
    subset, tests/fixtures/pipeline/slurm-subset.yaml); the GPU requests of pretrain and train reach Slurm."""
    shutil.copy(SUBSET, workflow.root / "subset.yaml")
    args = ["--configfile", "subset.yaml", "--profile", "profiles/slurm-local"]
    returncode, out = _run_until_done(workflow, args, timeout=1200)
    assert returncode == 0, out[-4000:]
    assert (workflow.root / "results/report/report.md").is_file()
    summary = workflow.root / "results/runs/tiny/method/seed0/summary.json"
    assert '"ticks_trained": 4' in summary.read_text()
    assert (workflow.root / "results/eval/tiny/method/seed0/toy_greedy.json").is_file()

    submissions = re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/rule_(\w+)/", out)
    submitted = {rule: job for job, rule in submissions}
    assert set(submitted) == SUBSET_RULES, out[-3000:]
    for rule, job in submitted.items():
        shown = _scontrol_job(job)
        assert "JobState=COMPLETED" in shown, shown
        wants_gpu = rule in ("pretrain", "train_local")
        assert ("gres:gpu:1" in shown) == wants_gpu, (rule, shown)


def _scontrol_job(job_id: str) -> str:
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    return shown.stdout + shown.stderr
