"""A real fork server in a subprocess, for the tests of ``commrl.run.forkserver``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from commrl.run import forkserver


class Server(forkserver.ServerProcess):
    """A real fork server (``commrl forkserver serve --preload ...``), preloaded before the test goes on."""

    def __init__(self, preload: tuple[str, ...] = ("commrl.rl.config",)):
        super().__init__(preload)
        assert self.wait(ready=True), "the fork server did not start"

    def env(self, **extra: str) -> dict[str, str]:
        """An environment whose ``commrl`` jobs go to this server (``extra`` added)."""
        env = {k: v for k, v in direct_env().items() if k != "SLURM_JOB_ID"}
        return {**env, forkserver.ENV_VAR: self.path, **extra}


def direct_env() -> dict[str, str]:
    """This process's environment without a fork server: a job runs in its own process."""
    return {k: v for k, v in os.environ.items() if k != forkserver.ENV_VAR}


def commrl(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    """``commrl ARGS`` in a subprocess, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "commrl.cli.main", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def forks_of(server: Server) -> list[int]:
    """The pids of the server's running forks (processes whose parent it is)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == server.proc.pid and fields[0] != "Z":
                pids.append(int(entry))
    return pids
