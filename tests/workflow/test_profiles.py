"""Profiles (local, slurm, slurm-local), the root `slurm` link, conda environments and the report bundle."""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

import pytest
import yaml
from snakemake_run import PAPER, REPO, Workflow

PROFILES = ["local", "slurm", "slurm-local"]


def test_no_default_profile() -> None:
    """profiles/default/ would be applied to every run and win over --profile, key by key."""
    assert not (REPO / "profiles" / "default").exists()


def test_root_slurm_link_points_at_the_slurm_profile() -> None:
    link = REPO / "slurm"
    assert link.is_symlink() and os.readlink(link) == "profiles/slurm"
    assert (link / "config.yaml").resolve() == (REPO / "profiles" / "slurm" / "config.yaml").resolve()


def test_profile_slurm_by_name_from_the_root(workflow: Workflow) -> None:
    """`snakemake --profile slurm` resolves the name in the working directory first (the root link)."""
    result = workflow.dry_run("--profile", "slurm", "--configfile", PAPER)
    assert "Using profile slurm for setting default command line arguments." in result.output
    assert result.counts()["train_verl"] == 2 * 7 * 3  # pairs A and B x 7 conditions x 3 seeds
    assert {r["slurm_extra"] for r in result.resources("train_verl")} == {"--exclusive --signal=USR1@900"}
    assert re.search(
        r"exec \S*preemptible\.sh 900 results/logs/train/A/\w+/seed\d\.log commrl verl-train --pair A",
        result.output,
    )
    # every wrapped command replaces the rule's shell (tests/workflow/test_preemptible.py: why)
    wrapped = [line for line in result.output.splitlines() if "preemptible.sh " in line]
    assert {"train_verl", "sweep_worker"} <= set(result.counts())
    assert wrapped and all(re.search(r"exec \S*preemptible\.sh ", line) for line in wrapped), wrapped[:3]
    assert "warning signal" not in result.output  # 900 s covers paper.yaml's checkpoint_s of 600 s


def test_a_warning_lead_shorter_than_the_checkpoint_or_to_the_batch_shell_is_reported(workflow: Workflow):
    """The profile's --signal lead against resources.<kind>.checkpoint_s, when the DAG is built."""
    profile = workflow.root / "profiles" / "slurm" / "config.yaml"
    train_first = "'--exclusive --signal=USR1@900'"  # train_verl's, then sweep_worker's
    text = profile.read_text().replace(train_first, "'--exclusive --signal=USR1@300'", 1)
    profile.write_text(text.replace(train_first, "'--exclusive --signal=B:USR1@900'"))
    out = workflow.dry_run("--profile", "slurm", "--configfile", PAPER).output
    assert "train jobs get their warning signal 300 s before the time limit, but" in out
    assert "resources.train.checkpoint_s = 600 s" in out
    assert "sweep jobs ask for --signal=B:USR1@900: B: signals the batch shell only" in out


def test_a_warning_lead_as_long_as_the_time_limit_is_reported(workflow: Workflow):
    """A 900 s lead on a 10-minute job: the warning would come at the start, every requeue a tick later."""
    config = workflow.config(PAPER)
    config["resources"]["train"]["runtime"] = 10
    out = workflow.dry_run("--profile", "slurm", "--configfile", workflow.write_config(config)).output
    assert "train jobs get their warning signal 900 s before the time limit, but their limit is 600 s" in out
    assert "sweep jobs get their warning" not in out  # its runtime is the paper's 2880 minutes


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_parses_and_drives_a_dry_run(workflow: Workflow, name: str) -> None:
    result = workflow.dry_run("--profile", f"profiles/{name}")
    assert result.counts()["eval_tiny"] == 2 * 3  # dense and method x 3 seeds (3 toy benchmarks a job)


@pytest.mark.parametrize("name", PROFILES)
def test_profiles_take_retries_rule_files_do_not(name: str) -> None:
    """Retries belong to the profile: a rule-level `retries:` would rerun inside the same allocation."""
    profile = yaml.safe_load((REPO / "profiles" / name / "config.yaml").read_text())
    assert "retries" in profile and profile.get("rerun-incomplete") is True
    for smk in (REPO / "workflow" / "rules").glob("*.smk"):
        assert not re.search(r"^\s+retries:", smk.read_text(), re.M), smk


def test_slurm_profiles_poll_safely() -> None:
    local = yaml.safe_load((REPO / "profiles" / "slurm-local" / "config.yaml").read_text())
    assert local["slurm-status-command"] == "squeue"  # no accounting database on the local controller
    assert local["default-resources"]["slurm_partition"] == "debug"
    assert local["slurm-init-seconds-before-status-checks"] == 2


def test_conda_envs_exist_parse_and_pin_python() -> None:
    common = (REPO / "workflow" / "rules" / "common.smk").read_text()
    named = set(re.findall(r"\.\./\.\./envs/([\w-]+\.yaml)", common))
    assert named == {"cpu.yaml", "train-gpu.yaml", "eval-gpu.yaml"}
    for name in named:
        env = yaml.safe_load((REPO / "envs" / name).read_text())
        assert "python=3.11" in env["dependencies"], name
        deploy = REPO / "envs" / name.replace(".yaml", ".post-deploy.sh")
        assert "pip install -q --no-deps -e ." in deploy.read_text(), deploy


def _png(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1], [0, 1])
    fig.savefig(path)
    plt.close(fig)


def test_snakemake_report_bundles_the_report_directory(workflow: Workflow) -> None:
    """`snakemake --report` picks up whatever figures `commrl report` drew (a directory output + patterns).
    The report directory is written here by hand: this tests the workflow's report markers, not the report."""
    out = workflow.root / "results" / "report"
    out.mkdir(parents=True)
    for name in ("fig02_score_tiny.png", "fig06_kl_tiny.png"):
        _png(out / name)
    (out / "report.md").write_text("# commrl report\n")
    (out / "report.html").write_text("<html><body>commrl report</body></html>\n")
    (out / "claims.json").write_text("{}\n")
    (out / "captions.json").write_text("{}\n")
    result = workflow.snakemake("--report", "bundle.zip")
    assert result.returncode == 0, result.output[-3000:]
    names = {Path(n).name for n in zipfile.ZipFile(workflow.root / "bundle.zip").namelist()}
    expected = {"fig02_score_tiny.png", "fig06_kl_tiny.png", "report.md", "claims.json", "captions.json"}
    assert expected <= names
