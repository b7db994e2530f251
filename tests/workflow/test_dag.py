"""The workflow's DAG, targets and lint, through real `snakemake` dry-runs (broken configs:
test_config_errors.py)."""

from __future__ import annotations

import re

import pytest
from snakemake_run import PAPER, Result, Workflow

TINY_CONDITIONS = (
    14  # the eight synchronous conditions and the six asynchronous ones (configs/pipeline/tiny.yaml)
)
SEEDS = 3  # seeds [0, 1, 2] of every condition, both configs
TINY_JOBS = {
    "init_store": 1,
    "init_pair": 1,
    "prepare_toy": 1,
    "pretrain": 1,
    "train_local": TINY_CONDITIONS * SEEDS,
    "eval_tiny": 2 * SEEDS,  # dense and method (eval.conditions), every seed: one job, three benchmarks
    "sweep_init": 1,
    "sweep_worker": 2,
    "sweep_summary": 1,
    "report": 1,
    "all": 1,
}
PAPER_RUNS = 2 * 7 * SEEDS  # pairs A and B x the six conditions of method.md §5 and anchor_only x seeds
PAPER_JOBS = {
    "init_store": 1,
    "init_pair": 2,  # one experiment (and stamp) per pair
    "prepare_math500": 1,
    "prepare_math": 1,
    "prepare_deepscaler": 1,
    "train_verl": PAPER_RUNS,
    "eval_A": PAPER_RUNS // 2 * 8,  # one job per benchmark of the suite's eight (eval.job_per: benchmark)
    "eval_B": PAPER_RUNS // 2 * 8,
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
    assert _has_command(tiny, "commrl init-store --stamp results/.init/mlflow.done")
    assert _has_command(tiny, "commrl init-store --pair tiny --stamp results/.init/pairs/tiny.done")
    assert _has_command(tiny, "commrl prepare --dataset toy --seed 0 --out results/data/toy")
    pretrain = "commrl pretrain --data results/data/toy --out results/models/tiny-base --seed 0"
    assert _has_command(tiny, pretrain, "--shipped assets/tiny-base")  # staged, checked, not trained
    assert _has_command(
        tiny,
        "commrl train pair=tiny condition=dense seed=0",
        f"out_dir={run}",
        "model.path=results/models/tiny-base",
        "data.dir=results/data/toy",
        "> results/logs/train/tiny/dense/seed0.log",
    )
    benchmarks = "--benchmark toy_greedy --benchmark toy_avg8 --benchmark toy_mc"  # one job, one model
    assert _has_command(
        tiny,
        f"commrl eval {benchmarks}",
        "--data toy_greedy=results/data/toy/test.jsonl --data toy_avg8=results/data/toy/test.jsonl",
        "--data toy_mc=results/data/toy/test.jsonl",
        "--out-dir results/eval/tiny/dense/seed0",
        "--pair tiny",
        "--backend vllm",
        f"--summary {run}/summary.json",
    )
    assert _has_command(
        tiny,
        "commrl sweep worker --config configs/sweep/tiny.yaml --study tiny-method --worker 1",
        "--out results/sweeps/tiny/tiny-method/worker1.json",
    )
    assert _has_command(tiny, "commrl report --pair tiny --netmodel configs/netmodel --out results/report")
    only = (  # the report reads the pipeline's runs alone: every run, evaluation and sweep of the config
        "--only results/runs/tiny/dense/seed0/summary.json",
        "results/runs/tiny/dense_async_tis/seed2/summary.json results/eval/tiny/dense/seed0/toy_greedy.json",
        "results/eval/tiny/method/seed2/toy_mc.json results/sweeps/tiny/tiny-method/summary > results/logs",
    )
    assert _has_command(tiny, "commrl report", *only)


def test_paper_commands_follow_the_cli_contracts(paper: Result) -> None:
    assert _has_command(
        paper,
        "commrl verl-train --pair B --condition dense --seed 0 --out results/runs/B/dense/seed0",
        "--data-dir results/data --val-file results/data/math500/test.parquet",
    )
    for dataset in ("math --source EleutherAI/hendrycks_math", "deepscaler"):  # both decontaminated
        assert _has_command(
            paper, f"commrl prepare --dataset {dataset}", "--exclude results/data/math500/test.parquet"
        )
    deepscaler = re.search(r"^rule prepare_deepscaler:\n    input: (.*)$", paper.output, re.M)
    assert deepscaler and deepscaler[1] == "results/data/math500/test.parquet"  # waits for MATH500's job
    math500 = "--benchmark commrl_math500", "--data commrl_math500=results/data/math500/test.jsonl"
    summary = "--summary results/runs/B/dense/seed0/summary.json"  # the model at the read tick comes from it
    assert _has_command(paper, "commrl eval", *math500, "--out-dir results/eval/B/dense/seed0", summary)
    assert not _has_command(paper, "--benchmark commrl_aime24", "--data")  # the benchmark registry's hub id


def test_eval_reads_the_summary_which_names_the_model(tiny: Result, paper: Result) -> None:
    """An evaluation's input is the run's summary.json (+ the benchmark's data), not final/: the summary
    names the model at the read tick, final/ or tick<read_at>/ (pair A's long KL runs)."""
    for result in (tiny, paper):
        inputs = re.findall(r"^rule eval_\w+:\n    input: (.*)$", result.output, re.M)
        assert inputs and all(i.split(", ")[0].endswith("/summary.json") for i in inputs)
        assert not [i for i in inputs if "/final" in i]


def test_paper_jobs_take_their_own_pairs_experiment(paper: Result) -> None:
    """Every job that logs runs of a pair waits for its pair's stamp alone (a pair added to or removed from
    the config leaves the others' jobs alone: test_rerun.py), and the report for the pair A network model
    that the tiny config draws too."""
    for rule in ("train_verl", "sweep_init", "sweep_worker"):
        inputs = re.findall(rf"^rule {rule}:\n    input: (.*)$", paper.output, re.M)
        assert inputs and all(re.match(r"results/\.init/pairs/[AB]\.done, ", i) for i in inputs), rule
        assert not [i for i in inputs if "mlflow.done" in i], rule
    verl = re.search(
        r"^rule train_verl:\n    input: (.*)\n.*\n.*\n.*\n.*\n.*\n    wildcards: (.*)$", paper.output, re.M
    )
    assert verl, paper.output[-3000:]
    pair, condition = re.match(r"pair=(\w+), condition=(\w+)", verl[2]).groups()
    assert verl[1].endswith(
        f"configs/verl/config.yaml, configs/verl/pair/{pair}.yaml, configs/condition/{condition}.yaml"
    )


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
    assert {r["gpu"] for r in paper.resources("eval_A") + paper.resources("eval_B")} == {"1"}
    assert all("gpu" not in r for r in paper.resources("prepare_math"))
    assert tiny.resources("train_local") and all("gpu" not in r for r in tiny.resources("train_local"))
    assert tiny.resources("eval_tiny") and all("gpu" not in r for r in tiny.resources("eval_tiny"))


def test_retries_grow_memory_and_time_but_not_for_resumable_jobs(workflow: Workflow, paper: Result) -> None:
    """The profile's `retries` resubmit a failed job: attempt k asks k times the memory and time, except a
    training or sweep job, which resumes from its checkpoints on a node asked for whole (480 GB, 48 h:
    twice that is a request no such node or partition grants)."""
    second = workflow.dry_run("--configfile", PAPER, "--attempt", "2")
    for rule in ("train_verl", "sweep_worker"):
        assert {(r["mem_mb"], r["runtime"]) for r in paper.resources(rule) + second.resources(rule)} == {
            ("480000", "2880")
        }, rule
    first, again = paper.resources("eval_A")[0], second.resources("eval_A")[0]
    assert (int(again["mem_mb"]), int(again["runtime"])) == (
        2 * int(first["mem_mb"]),
        2 * int(first["runtime"]),
    )


def test_a_gpu_job_is_one_task_on_one_node_in_the_slurm_plugins_submit_command(paper: Result) -> None:
    """The sbatch line the Slurm executor plugin builds (its own ``get_submit_command``) from a training
    job's resolved resources: one node, 64 CPUs for the one task, 8 GPUs; without `tasks_per_gpu: 0` the
    plugin adds --ntasks-per-gpu=1, 8 tasks of 64 CPUs each on any number of nodes."""
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.submit_string import get_submit_command

    class Resources(dict):
        __getattr__ = dict.__getitem__

    params = dict(run_uuid="u", slurm_logfile="log", comment_str="c", account="", partition="", workdir="/w")
    for rule in ("train_verl", "sweep_worker"):
        resolved = paper.resources(rule)[0]
        assert (resolved["nodes"], resolved["tasks_per_gpu"]) == ("1", "0")
        res = Resources({k: int(v) if v.isdigit() else v for k, v in resolved.items()})
        job = SimpleNamespace(resources=res, threads=64)
        sbatch = get_submit_command(
            job, params, settings=SimpleNamespace(requeue=True, qos=None, reservation=None)
        )
        assert "--nodes=1" in sbatch and "--cpus-per-task=64" in sbatch, sbatch
        assert "--ntasks-per-gpu" not in sbatch, sbatch
        del res["tasks_per_gpu"]
        assert "--ntasks-per-gpu=1" in get_submit_command(
            job, params, settings=SimpleNamespace(requeue=True, qos=None, reservation=None)
        )
    assert all("nodes" not in r for r in paper.resources("prepare_math"))


def test_a_resource_kind_left_out_takes_the_schema_default_whole(workflow: Workflow) -> None:
    """Without resources.train the schema's default for the kind applies (a kind that is given is taken
    whole and must name threads, mem_mb and runtime itself: test_config_errors.py)."""
    config = workflow.config()
    del config["resources"]["train"]
    result = workflow.dry_run("-p", "--until", "train_local", "--configfile", workflow.write_config(config))
    assert {(r["mem_mb"], r["runtime"]) for r in result.resources("train_local")} == {("6000", "120")}
    assert _has_command(result, "commrl train pair=tiny", " threads=2 ")


@pytest.mark.parametrize(
    ("target", "chain"),
    [
        (
            "results/eval/tiny/method/seed0/toy_greedy.json",
            {
                "init_store": 1,
                "init_pair": 1,
                "prepare_toy": 1,
                "pretrain": 1,
                "train_local": 1,
                "eval_tiny": 1,
            },
        ),
        (
            "results/eval/A/method/seed0/commrl_math500.json",
            {
                "init_store": 1,
                "init_pair": 1,
                "prepare_math500": 1,
                "prepare_math": 1,
                "train_verl": 1,
                "eval_A": 1,
            },
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
        "init_pair": 1,
        "prepare_toy": 1,
        "pretrain": 1,
        "train_local": TINY_CONDITIONS * SEEDS,
    }


def test_unknown_pair_target_names_the_pair_and_the_fix(workflow: Workflow) -> None:
    result = workflow.snakemake("-n", "results/eval/nope/method/seed0/toy_greedy.json")
    assert result.returncode != 0
    assert "pair 'nope' is not in the pipeline config's `pairs`" in result.output


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


def test_a_data_set_excluding_itself_fails_naming_the_field(workflow: Workflow) -> None:
    """`exclude` names another data set's held-out split; naming its own would be a cycle in the DAG."""
    config = workflow.config(PAPER)
    config["datasets"]["math500"]["exclude"] = "math500"
    result = workflow.snakemake("-n", "--configfile", workflow.write_config(config))
    assert result.returncode != 0
    assert "datasets.math500.exclude: 'math500' excludes itself" in result.output, result.output[-3000:]
    assert "Cyclic" not in result.output and "Job stats" not in result.output


def test_a_pair_without_its_drivers_pair_file_fails_naming_the_file(workflow: Workflow) -> None:
    """A training run composes its driver's pair/<pair>.yaml (an input of its job): a pair without one is
    named before any job is planned."""
    config = workflow.config()
    config["pairs"]["tiny2"] = {
        key: value for key, value in config["pairs"]["tiny"].items() if key != "sweep"
    }
    result = workflow.snakemake("-n", "--configfile", workflow.write_config(config))
    assert result.returncode != 0
    message = (
        "pairs.tiny2: the local driver has no configs/train/pair/tiny2.yaml, the training config of pair"
    )
    assert message in result.output, result.output[-3000:]
    assert "Job stats" not in result.output


def test_the_slurm_profiles_commented_site_keys_pin_their_rules(workflow: Workflow) -> None:
    """Uncommented, the GPU model of profiles/slurm reaches the jobs of the rules it names (the evaluations
    are eval_<pair> rules), and a sweep worker takes its node whole, as a training run does."""
    profile = workflow.root / "profiles" / "slurm" / "config.yaml"
    text = profile.read_text()
    block = text[text.index("set-resources:") : text.index("\n\n", text.index("set-resources:"))]
    profile.write_text(text.replace(block, re.sub(r"^(\s*)# (\s*\w+:)", r"\1\2", block, flags=re.M)))
    result = workflow.dry_run("--profile", "slurm", "--configfile", PAPER)
    for rule in ("train_verl", "sweep_worker", "eval_A", "eval_B"):
        resources = result.resources(rule)
        assert resources and {r.get("gpu_model") for r in resources} == {"h100"}, rule
    assert {r["slurm_extra"] for r in result.resources("sweep_worker")} == {"--exclusive --signal=USR1@900"}


@pytest.mark.parametrize("config", ["configs/pipeline/tiny.yaml", PAPER])
def test_lint_is_clean(workflow: Workflow, config: str) -> None:
    """Both shipped configs pass `snakemake -n --lint` (the config errors: test_config_errors.py)."""
    result = workflow.snakemake("-n", "--lint", "--configfile", config)
    assert result.returncode == 0, result.output
    assert "Congratulations, your workflow is in a good condition!" in result.output
