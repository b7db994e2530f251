"""The workflow's DAG, config validation, targets and lint, through real `snakemake` dry-runs."""

from __future__ import annotations

import pytest
from snakemake_run import PAPER, Result, Workflow

TINY_CONDITIONS = (
    14  # the eight synchronous conditions and the six asynchronous ones (configs/pipeline/tiny.yaml)
)
SEEDS = 3  # seeds [0, 1, 2] of every condition, both configs
TINY_JOBS = {
    "init_store": 1,
    "prepare_toy": 1,
    "pretrain": 1,
    "train_local": TINY_CONDITIONS * SEEDS,
    "eval": 2 * 3 * SEEDS,  # dense and method (eval.conditions) x toy_greedy, toy_avg8, toy_mc, every seed
    "sweep_init": 1,
    "sweep_worker": 2,
    "sweep_summary": 1,
    "report": 1,
    "all": 1,
}
PAPER_RUNS = 2 * 7 * SEEDS  # pairs A and B x the six conditions of method.md §5 and anchor_only x seeds
PAPER_JOBS = {
    "init_store": 1,
    "prepare_math500": 1,
    "prepare_math": 1,
    "prepare_deepscaler": 1,
    "train_verl": PAPER_RUNS,
    "eval": PAPER_RUNS * 8,  # the eight benchmarks of the suite
    "sweep_init": 1,  # pair A only
    "sweep_worker": 8,
    "sweep_summary": 1,
    "report": 1,
    "all": 1,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Result:
    """The dry-run of the default target on the default (tiny) config, with the shell commands."""
    return Workflow(tmp_path_factory.mktemp("tiny")).dry_run("-p")


@pytest.fixture(scope="module")
def paper(tmp_path_factory: pytest.TempPathFactory) -> Result:
    """The dry-run of the default target on the paper config, with the shell commands."""
    return Workflow(tmp_path_factory.mktemp("paper")).dry_run("-p", "--configfile", PAPER)


def test_tiny_default_dag_has_every_stage(tiny: Result) -> None:
    assert tiny.counts() == TINY_JOBS


def test_paper_dag_replaces_the_default_config(paper: Result) -> None:
    """--configfile replaces the default tiny config (no tiny jobs), rather than being merged over it."""
    assert paper.counts() == PAPER_JOBS


def _has_command(result: Result, *parts: str) -> bool:
    """Whether one of the dry-run's shell commands contains every part."""
    commands = [line for line in result.output.splitlines() if line.startswith("Shell command: ")]
    return any(all(part in command for part in parts) for command in commands)


def test_tiny_commands_follow_the_cli_contracts(tiny: Result) -> None:
    run = "results/runs/tiny/dense/seed0"
    assert _has_command(tiny, "commrl init-store --pair tiny --stamp results/.init/mlflow.done")
    assert _has_command(tiny, "commrl prepare --dataset toy --seed 0 --out results/data/toy")
    pretrain = "commrl pretrain --data results/data/toy --out results/models/tiny-base --seed 0"
    assert _has_command(tiny, pretrain)
    assert _has_command(
        tiny,
        "commrl train pair=tiny condition=dense seed=0",
        f"out_dir={run}",
        "model.path=results/models/tiny-base",
        "data.dir=results/data/toy",
        "> results/logs/train/tiny/dense/seed0.log",
    )
    assert _has_command(
        tiny,
        "commrl eval --benchmark toy_mc",
        "--pair tiny",
        "--backend vllm",
        f"--summary {run}/summary.json",
        "--data results/data/toy/test.jsonl",
        "--out results/eval/tiny/dense/seed0/toy_mc.json",
    )
    assert _has_command(
        tiny,
        "commrl sweep worker --config configs/sweep/tiny.yaml --study tiny-method --worker 1",
        "--out results/sweeps/tiny/tiny-method/worker1.json",
    )
    assert _has_command(tiny, "commrl report --pair tiny --netmodel configs/netmodel --out results/report")


def test_paper_commands_follow_the_cli_contracts(paper: Result) -> None:
    assert _has_command(
        paper,
        "commrl verl-train --pair B --condition dense --seed 0 --out results/runs/B/dense/seed0",
        "--data-dir results/data --val-file results/data/math500/test.parquet",
    )
    assert _has_command(
        paper,
        "commrl prepare --dataset math --source EleutherAI/hendrycks_math",
        "--exclude results/data/math500/test.parquet",
    )
    math500 = "--benchmark commrl_math500", "--data results/data/math500/test.jsonl"
    summary = "--summary results/runs/B/dense/seed0/summary.json"  # the model at the read tick comes from it
    assert _has_command(paper, "commrl eval", *math500, summary)
    assert not _has_command(paper, "--benchmark commrl_aime24", "--data")  # the benchmark registry's hub id


def test_paper_long_kl_runs_ask_150_ticks(paper: Result) -> None:
    out = paper.output
    commands = [
        line for line in out.splitlines() if line.startswith("Shell command: ") and "verl-train" in line
    ]
    long = [line for line in commands if "--pair A" in line and " ticks=150 " in line]
    long_runs = {line.split("--condition ")[1].split()[0] for line in long}
    assert long_runs == {"dense", "method", "dropout", "prf_mask"}
    assert not [line for line in commands if "--pair B" in line and "ticks=" in line]


def test_paper_gpu_jobs_ask_for_gpus_tiny_jobs_do_not(paper: Result, tiny: Result) -> None:
    assert {r["gpu"] for r in paper.resources("train_verl")} == {"8"}
    assert {r["gpu"] for r in paper.resources("eval")} == {"1"}
    assert all("gpu" not in r for r in paper.resources("prepare_math"))
    assert tiny.resources("train_local") and all("gpu" not in r for r in tiny.resources("train_local"))
    assert all("gpu" not in r for r in tiny.resources("eval"))


def test_retries_grow_memory_and_time_with_the_attempt(workflow: Workflow, paper: Result) -> None:
    """The profile's `retries` resubmit a failed job; attempt k asks k times the memory and time."""
    first = paper.resources("train_verl")[0]
    second = workflow.dry_run("--configfile", PAPER, "--attempt", "2").resources("train_verl")[0]
    assert (first["mem_mb"], first["runtime"]) == ("480000", "2880")
    assert (second["mem_mb"], second["runtime"]) == ("960000", "5760")


@pytest.mark.parametrize(
    ("target", "chain"),
    [
        (
            "results/eval/tiny/method/seed0/toy_greedy.json",
            {"init_store": 1, "prepare_toy": 1, "pretrain": 1, "train_local": 1, "eval": 1},
        ),
        (
            "results/eval/A/method/seed0/commrl_math500.json",
            {"init_store": 1, "prepare_math500": 1, "prepare_math": 1, "train_verl": 1, "eval": 1},
        ),
    ],
)
def test_single_benchmark_target_resolves_to_its_chain(workflow: Workflow, target: str, chain: dict) -> None:
    config = ["--configfile", PAPER] if "/A/" in target else []
    assert workflow.dry_run(target, *config).counts() == chain


def test_until_stops_at_the_named_rule(workflow: Workflow) -> None:
    counts = workflow.dry_run("--until", "train_local").counts()
    assert counts == {
        "init_store": 1,
        "prepare_toy": 1,
        "pretrain": 1,
        "train_local": TINY_CONDITIONS * SEEDS,
    }


def test_unknown_pair_target_names_the_pair_and_the_fix(workflow: Workflow) -> None:
    result = workflow.snakemake("-n", "results/eval/nope/method/seed0/toy_greedy.json")
    assert result.returncode != 0
    assert "pair 'nope' is not in the pipeline config's `pairs`" in result.output


def _set(config: dict, path: str, value) -> dict:
    *parents, last = path.split(".")
    node = config
    for key in parents:
        node = node[key]
    node[last] = value
    return config


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("pairs.tiny.seeds", [-1], "['pairs']['tiny']['seeds'][0]"),
        ("pairs.tiny.conditions", ["dense", "Method"], "'Method' does not match"),
        ("pairs.tiny.driver", "slurm", "['pairs']['tiny']['driver']"),
        ("pairs.tiny.eval.backend", "tgi", "['pairs']['tiny']['eval']['backend']"),
        ("resources.train.mem_mb", "lots", "['resources']['train']['mem_mb']"),
        ("pairs.tiny.ticks", {"anchor_off": 5, "prf_mask": 0}, "['pairs']['tiny']['ticks']['prf_mask']"),
        ("pairs.tiny.ticks", {"sweep!": 5}, "'sweep!' does not match"),
        ("datasets.toy", {"seed": 0, "source": "x"}, "['datasets']['toy']"),
        ("datasets.gsm8k", {"source": "openai/gsm8k"}, "'gsm8k' is not one of"),
    ],
)
def test_bad_config_value_fails_validation_naming_the_field(
    workflow: Workflow, path: str, value, message: str
) -> None:
    config = workflow.write_config(_set(workflow.config(), path, value))
    result = workflow.snakemake("-n", "--configfile", config)
    assert result.returncode != 0
    assert "Error validating config file" in result.output
    assert message in result.output
    assert not (workflow.root / "results").exists()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("pairs.tiny.train_data", "math", "pairs.tiny.train_data: 'math' is not in `datasets`"),
        (
            "pairs.tiny.conditions",
            ["dense", "mehtod"],
            "pairs.tiny.conditions: 'mehtod' has no configs/condition/mehtod.yaml; known: anchor_off,",
        ),
        ("pairs.tiny.sweep.config", "configs/sweep/missing.yaml", "pairs.tiny.sweep.config: cannot read"),
    ],
)
def test_dangling_references_fail_before_any_job(workflow: Workflow, path: str, value, message: str) -> None:
    config = workflow.write_config(_set(workflow.config(), path, value))
    result = workflow.snakemake("-n", "--configfile", config)
    assert result.returncode != 0
    assert message in result.output


def test_ticks_for_a_condition_not_run_is_an_error(workflow: Workflow) -> None:
    config = workflow.config()
    config["pairs"]["tiny"]["conditions"] = ["dense"]
    config["pairs"]["tiny"]["ticks"] = {"method": 10}
    result = workflow.snakemake("-n", "--configfile", workflow.write_config(config))
    assert result.returncode != 0
    assert "pairs.tiny.ticks.method: 'method' is not in pairs.tiny.conditions" in result.output


def test_evaluating_a_condition_not_run_is_an_error(workflow: Workflow) -> None:
    config = workflow.config()
    config["pairs"]["tiny"]["conditions"] = ["dense"]
    result = workflow.snakemake("-n", "--configfile", workflow.write_config(config))
    assert result.returncode != 0
    assert "pairs.tiny.eval.conditions: 'method' is not in pairs.tiny.conditions" in result.output


def test_sweep_file_without_worker_count_fails_naming_file_and_key(workflow: Workflow) -> None:
    sweep = workflow.root / "configs" / "sweep" / "tiny.yaml"
    sweep.write_text(sweep.read_text().replace("n_workers: 2", "n_workers: two"))
    result = workflow.snakemake("-n")
    assert result.returncode != 0
    assert "configs/sweep/tiny.yaml is not a valid sweep config" in result.output
    assert "n_workers" in result.output


def test_a_condition_the_pairs_driver_cannot_run_is_an_error(workflow: Workflow) -> None:
    """configs/condition/method_same_sampler.yaml says the verl driver cannot run it, and why."""
    config = workflow.config(PAPER)
    config["pairs"]["A"]["conditions"].append("method_same_sampler")
    result = workflow.snakemake("-n", "--configfile", workflow.write_config(config))
    assert result.returncode != 0
    assert (
        "pairs.A.conditions: 'method_same_sampler' does not run on the verl driver: its sampler"
        in result.output
    )


def test_a_new_condition_file_is_a_condition_of_the_pipeline(workflow: Workflow) -> None:
    """The workflow's conditions are the files of configs/condition/: no list to keep in step."""
    method = workflow.root / "configs" / "condition" / "method.yaml"
    (method.parent / "method_copy.yaml").write_text(
        method.read_text().replace("condition: method", "condition: method_copy")
    )
    config = workflow.config()
    config["pairs"]["tiny"]["conditions"] = ["method_copy"]
    config["pairs"]["tiny"]["eval"]["conditions"] = ["method_copy"]
    result = workflow.dry_run("--configfile", workflow.write_config(config), "--until", "train_local")
    assert result.counts()["train_local"] == SEEDS


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("pairs.B.pretrain", {"seed": 0}, "['pairs']['B']"),  # verl pairs start from a hub model
        ("datasets.math", {"exclude": "math500"}, "'source' is a required property"),
    ],
)
def test_paper_config_rules(workflow: Workflow, path: str, value, message: str) -> None:
    config = workflow.write_config(_set(workflow.config(PAPER), path, value))
    result = workflow.snakemake("-n", "--configfile", config)
    assert result.returncode != 0
    assert message in result.output


@pytest.mark.parametrize("config", [[], ["--configfile", PAPER]])
def test_lint_is_clean(workflow: Workflow, config: list[str]) -> None:
    result = workflow.snakemake("--lint", *config)
    assert result.returncode == 0, result.output
    assert "Congratulations, your workflow is in a good condition!" in result.output
