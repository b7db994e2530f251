"""workflow/scripts/preemptible.sh under Snakemake: a SIGTERM to every process of a job (Slurm's preemption,
its time limit, `scancel`) must reach Snakemake as the training command's own status.

Snakemake runs a rule's shell as ``bash -c "set -euo pipefail; <shell>"``. Without ``exec`` that bash forks
the wrapper and, having no trap, dies of the SIGTERM at once: Snakemake reports the job "died with SIGTERM"
while the wrapper and the trainer, now orphans, checkpoint and exit 75 to nobody (and under Slurm's
``proctrack/cgroup`` are killed when the job step's main task ends, so the requeue never happens). The
training rules ``exec`` the wrapper, which traps SIGTERM and SIGHUP and waits for the command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from snakemake_run import REPO

CHILD = """
import pathlib, signal, sys, time
def stop(signum, frame):
    time.sleep(0.5)  # a checkpoint
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGHUP, stop)
pathlib.Path("ready").write_text("")
time.sleep(60)
"""


def _signalled_job(tmp_path: Path, sig: signal.Signals) -> str:
    """Run a one-rule workflow whose command exits 75 on SIGTERM or SIGHUP, send ``sig`` to every process
    of it once the command runs, and return Snakemake's output."""
    wrapper = REPO / "workflow" / "scripts" / "preemptible.sh"
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "Snakefile").write_text(
        f'rule a:\n    output: "done"\n    log: "a.log"\n'
        f'    shell: "exec {wrapper} 0 {{log}} {sys.executable} child.py > {{log}} 2>&1"\n'
    )
    with open(tmp_path / "snakemake.out", "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "snakemake", "--cores", "1"],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.time() + 60
    while not (tmp_path / "ready").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    os.killpg(proc.pid, sig)  # every process of the job, as Slurm signals a job step's
    proc.wait(60)
    return (tmp_path / "snakemake.out").read_text()


def _wrapper_saw(log: Path, status: int) -> bool:
    deadline = time.time() + 30
    while time.time() < deadline:
        if log.is_file() and log.read_text().rstrip().endswith(f"preemptible: exit {status}"):
            return True
        time.sleep(0.1)
    return False


def test_a_sigterm_to_the_jobs_processes_reaches_snakemake_as_the_commands_exit_75(tmp_path: Path) -> None:
    output = _signalled_job(tmp_path, signal.SIGTERM)
    assert "returned non-zero exit status 75" in output, output[-2000:]
    assert "died with" not in output
    assert _wrapper_saw(tmp_path / "a.log", 75)


def test_a_sighup_leaves_the_wrapper_waiting_for_the_commands_checkpoint(tmp_path: Path) -> None:
    """The terminal of `make pipeline` closed: Snakemake itself dies of the SIGHUP, the trainer checkpoints
    (commrl takes SIGHUP as a preemption) and the wrapper, which traps it, still keeps the attempt's log."""
    _signalled_job(tmp_path, signal.SIGHUP)
    assert _wrapper_saw(tmp_path / "a.log", 75)
    assert list(tmp_path.glob("a.attempt-*.log"))
