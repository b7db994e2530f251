"""A real fork server in a subprocess, for the tests of ``commrl.run.forkserver``."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from commrl.run import forkserver

SERVE = (
    "import sys\n"
    "from commrl.run.forkserver import ForkServer\n"
    "server = ForkServer(sys.argv[1])\n"
    "server.preload(sys.argv[2:])\n"
    "print('ready', flush=True)\n"
    "server.serve()\n"
    "print('served', server.served, flush=True)\n"
)


class Server:
    """A fork server in a subprocess; ``stop()`` returns how many jobs it forked."""

    def __init__(self, preload: tuple[str, ...] = ("commrl.rl.config",)):
        self.folder = tempfile.mkdtemp(prefix="fs-")  # a Unix socket's path must stay under ~100 bytes
        self.path = os.path.join(self.folder, "socket")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, self.path, *preload],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def env(self, **extra: str) -> dict[str, str]:
        """An environment whose ``commrl`` jobs go to this server (``extra`` added)."""
        env = {k: v for k, v in direct_env().items() if k != "SLURM_JOB_ID"}
        return {**env, forkserver.ENV_VAR: self.path, **extra}

    def stop(self) -> int:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        os.rmdir(self.folder)
        return int(out.split()[-1])


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
