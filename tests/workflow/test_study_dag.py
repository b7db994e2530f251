"""The grid-study target (workflow/rules/study.smk) through real `snakemake` dry-runs: outside the default
DAG (test_dag.py's job counts), its jobs and commands, and a target that is not a grid study."""

from __future__ import annotations

from snakemake_run import Workflow

STUDY_JOBS = {
    "init_store": 1,
    "init_pair": 1,
    "prepare_toy": 1,
    "pretrain": 1,
    "study_init": 1,
    "study_worker": 2,  # n_workers of configs/sweep/tiny-regime.yaml
    "study_summary": 1,
}


def test_the_tiny_regime_target_runs_init_workers_and_summary(workflow: Workflow) -> None:
    result = workflow.dry_run("-p", "results/studies/tiny-regime/summary")
    assert result.counts() == STUDY_JOBS
    config = "--config configs/sweep/tiny-regime.yaml --study tiny-regime"
    commands = [line for line in result.output.splitlines() if line.startswith("Shell command: ")]
    for step in ("init", "worker", "summary"):
        assert any(f"commrl sweep {step} {config}" in c for c in commands), step
    assert any("--worker 1 --out results/studies/tiny-regime/worker1.json" in c for c in commands), "worker 1"


def test_a_search_config_is_not_a_study_target(workflow: Workflow) -> None:
    result = workflow.snakemake("-n", "results/studies/tiny/summary")
    assert result.returncode != 0
    assert (
        "configs/sweep/tiny.yaml is not a grid study (set sampler: {name: grid} and a grid)" in result.output
    )
