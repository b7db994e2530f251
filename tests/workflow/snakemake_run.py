"""A private copy of the workflow and real `snakemake` runs in it, for the workflow tests.

Every test works in its own copy (Snakefile, workflow/, configs/, envs/, profiles/, the `slurm` link,
assets/) under tmp_path, so that nothing touches the checkout's results/ or .snakemake/.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOW_FILES = ["Snakefile", "workflow", "configs", "envs", "profiles", "slurm", "assets"]
PAPER = "configs/pipeline/paper.yaml"


@dataclass
class Result:
    returncode: int
    output: str

    def counts(self) -> dict[str, int]:
        """The first "Job stats" table of the output: rule -> number of jobs (without the total)."""
        match = re.search(r"Job stats:\njob\s+count\n[-\s]+\n(.*?)\ntotal\s+(\d+)", self.output, re.S)
        assert match, f"no job stats table in the output:\n{self.output[-3000:]}"
        counts = {}
        for line in match.group(1).splitlines():
            rule, count = line.split()
            counts[rule] = int(count)
        assert sum(counts.values()) == int(match.group(2))
        return counts

    def resources(self, rule: str) -> list[dict[str, str]]:
        """The `resources:` line of every job of `rule` in a dry-run's job listing."""
        blocks = re.findall(rf"^rule {rule}:\n(.*?)(?:\n\n|\nShell command|\Z)", self.output, re.S | re.M)
        found = []
        for block in blocks:
            line = re.search(r"^\s+resources: (.*)$", block, re.M)
            found.append(dict(item.split("=", 1) for item in line.group(1).split(", ")) if line else {})
        return found


class Workflow:
    """A copy of the workflow in a temporary directory and `snakemake` run from its root."""

    def __init__(self, root: Path, configfile: str | None = None):
        self.root = root
        self.configfile = configfile  # given to every snakemake call (after the targets) when set
        for name in WORKFLOW_FILES:
            src = REPO / name
            if src.is_symlink():
                (root / name).symlink_to(os.readlink(src))
            elif src.is_dir():
                shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, root / name)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.pop("MLFLOW_TRACKING_URI", None)
        env.pop("COMMRL_RESULTS", None)
        return env

    def snakemake(self, *args: str, timeout: float = 120, forkserver: bool = False) -> Result:
        """``snakemake ARGS``; ``forkserver``: under ``commrl forkserver run --`` (as `make pipeline`)."""
        config = ["--configfile", self.configfile] if self.configfile else []
        cmd = [sys.executable, "-m", "snakemake", *args, *config]
        if forkserver:
            cmd = [sys.executable, "-m", "commrl.cli.main", "forkserver", "run", "--", *cmd]
        proc = subprocess.run(
            cmd, cwd=self.root, env=self.env(), capture_output=True, text=True, timeout=timeout
        )
        return Result(proc.returncode, proc.stdout + proc.stderr)

    def dry_run(self, *args: str) -> Result:
        result = self.snakemake("-n", "--cores", "2", *args)
        assert result.returncode == 0, result.output[-3000:]
        return result

    def config(self, path: str = "configs/pipeline/tiny.yaml") -> dict:
        return yaml.safe_load((self.root / path).read_text())

    def write_config(self, config: dict, name: str = "test.yaml") -> str:
        path = self.root / "configs" / "pipeline" / name
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return str(path.relative_to(self.root))
