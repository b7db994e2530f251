"""Bad configuration never reaches a job: a table of broken configs, each a shipped config with one change,
each rejected by a real `snakemake -n` before any job is planned, with the file and the field named and
without a Python traceback (workflow/rules/common.smk, check_config)."""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from snakemake_run import PAPER, REPO, Result, Workflow

from commrl.cli.prepare import DATASETS

TINY = "configs/pipeline/tiny.yaml"


@dataclass(frozen=True)
class Case:
    """`change` applied to a copy of `base`, written as configs/pipeline/<id>.yaml; the error names `where`
    (default: that file) and contains `message`. `files`: more files of the copy, path -> (source, edit)."""

    id: str
    change: Callable[[dict], object]
    message: str
    base: str = TINY
    where: str | None = None
    files: dict[str, tuple[str, Callable[[str], str]]] = field(default_factory=dict)


def _set(path: str, value) -> Callable[[dict], None]:
    """The change that sets the dotted `path` of a config to `value`."""

    def change(config: dict) -> None:
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node[key]
        node[last] = value

    return change


def _rename_benchmark(config: dict) -> None:
    benchmarks = config["pairs"]["tiny"]["eval"]["benchmarks"]
    benchmarks["toy_greedyy"] = benchmarks.pop("toy_greedy")


def _without_prf_mask(config: dict) -> None:
    config["pairs"]["A"]["conditions"].remove("prf_mask")  # pairs.A.ticks still asks 150 ticks of it


def _sweep_copy(old: str, new: str) -> tuple[str, Callable[[str], str]]:
    """configs/sweep/tiny.yaml with `old` replaced by `new`."""
    return "configs/sweep/tiny.yaml", lambda text: text.replace(old, new)


def _broken_sweep_file(case_id: str, old: str, new: str, message: str) -> Case:
    """The tiny pair's own sweep file (configs/sweep/tiny.yaml) with `old` replaced by `new`, the pipeline
    config unchanged: the error names the sweep file."""
    sweep = "configs/sweep/tiny.yaml"
    return Case(case_id, lambda config: None, message, where=sweep, files={sweep: _sweep_copy(old, new)})


CASES = [
    # the schema (workflow/schemas/config.schema.yaml): missing, unknown and out-of-range keys
    Case(
        "train_resources_without_threads",
        _set("resources.train", {"mem_mb": 6000}),
        "resources.train: missing threads, runtime (required here: threads, mem_mb, runtime)",
    ),
    Case(
        "seed_above_numpys",
        _set("pairs.tiny.seeds", [0, 2**32]),
        "pairs.tiny.seeds[1]: 4294967296 is greater",
    ),
    Case("negative_runtime", _set("resources.eval.runtime", -5), "resources.eval.runtime: -5 is less than"),
    Case(
        "unknown_top_level_key", _set("resource", {}), "resource: unknown key; allowed here: datasets, pairs"
    ),
    Case("empty_seeds", _set("pairs.tiny.seeds", []), "pairs.tiny.seeds: [] should be non-empty"),
    Case(
        "duplicate_seeds", _set("pairs.tiny.seeds", [0, 1, 0]), "pairs.tiny.seeds: [0, 1, 0] has non-unique"
    ),
    Case(
        "toy_with_a_source",
        _set("datasets.toy", {"seed": 0, "source": "x"}),
        "datasets.toy.source: unknown key; allowed here: seed",
    ),
    Case("unknown_driver", _set("pairs.tiny.driver", "slurm"), "pairs.tiny.driver: 'slurm' is not one of"),
    Case(
        "memory_not_a_number",
        _set("resources.train.mem_mb", "lots"),
        "resources.train.mem_mb: 'lots' is not of type 'integer'",
    ),
    Case(
        "ticks_key_pattern",
        _set("pairs.tiny.ticks", {"sweep!": 5}),
        "pairs.tiny.ticks.sweep!: 'sweep!' does not",
    ),
    Case(
        "verl_pair_with_pretrain",
        _set("pairs.B.pretrain", {"seed": 0}),
        "pairs.B.pretrain: not allowed here (a verl pair starts from the hub model",
        base=PAPER,
    ),
    Case(
        "dataset_without_source",
        _set("datasets.math", {"exclude": "math500"}),
        "datasets.math: missing source (required here: source)",
        base=PAPER,
    ),
    # cross-references (check_config): conditions, data sets, benchmarks, sweep files
    Case(
        "unknown_condition",
        _set("pairs.tiny.conditions", ["dense", "mehtod"]),
        "pairs.tiny.conditions: 'mehtod' has no configs/condition/mehtod.yaml; the local driver runs: anchor",
    ),
    Case(
        "condition_the_driver_cannot_run",
        lambda c: c["pairs"]["A"]["conditions"].append("method_same_sampler"),
        "pairs.A.conditions: 'method_same_sampler' does not run on the verl driver: its sampler",
        base=PAPER,
    ),
    Case(
        "ticks_of_a_condition_not_run",
        _without_prf_mask,
        "pairs.A.ticks.prf_mask: 'prf_mask' is not in pairs.A.conditions",
        base=PAPER,
    ),
    Case(
        "ticks_before_the_read_point",
        _set("pairs.A.ticks.method", 50),
        "pairs.A.ticks.method: 50 ticks end before the pair's read point, tick 100 (read_at in "
        "configs/verl/pair/A.yaml): give at least 100",
        base=PAPER,
    ),
    Case(
        "verl_train_data_not_the_pair_files",
        _set("pairs.B.train_data", "math"),
        "pairs.B.train_data: 'math', but configs/verl/pair/B.yaml trains on dataset.train 'deepscaler' (what "
        "commrl verl-train reads); make the two the same",
        base=PAPER,
    ),
    Case(
        "ticks_a_condition_cannot_run",
        _set("pairs.tiny.ticks", {"method_async": 1}),
        "pairs.tiny.ticks.method_async: 1 ticks of method_async: rl.staleness=1 is out of range",
    ),
    Case(
        "evaluating_a_condition_not_run",
        _set("pairs.tiny.conditions", ["dense"]),
        "pairs.tiny.eval.conditions: 'method' is not in pairs.tiny.conditions",
    ),
    Case(
        "train_data_not_in_datasets",
        _set("pairs.tiny.train_data", "math"),
        "pairs.tiny.train_data: 'math' is not in `datasets` (toy); add datasets.math",
    ),
    Case(
        "val_data_without_a_test_split",
        _set("pairs.B.val_data", "math"),
        "pairs.B.val_data: 'math' has no test.parquet (`commrl prepare --dataset math` writes train.parquet)",
        base=PAPER,
    ),
    Case(
        "misspelled_benchmark",
        _rename_benchmark,
        "pairs.tiny.eval.benchmarks.toy_greedyy: 'toy_greedyy' is not in the eval registry",
    ),
    Case(
        "benchmark_without_data",
        _set("pairs.tiny.eval.benchmarks.toy_mc", {}),
        "pairs.tiny.eval.benchmarks.toy_mc: no `data`, and the registry has no source for toy_mc",
    ),
    Case(
        "benchmark_data_not_made",
        _set("pairs.tiny.eval.benchmarks.toy_mc", {"data": "results/data/toy/tset.jsonl"}),
        "pairs.tiny.eval.benchmarks.toy_mc.data: 'results/data/toy/tset.jsonl' is not a file of the data",
    ),
    Case(
        "shipped_base_missing",
        _set("pairs.tiny.pretrain.shipped", "assets/tiny-bsae"),
        "pairs.tiny.pretrain.shipped: 'assets/tiny-bsae' has no SHIPPED.json",
    ),
    Case(
        "missing_sweep_file",
        _set("pairs.tiny.sweep.config", "configs/sweep/missing.yaml"),
        "pairs.tiny.sweep.config: cannot read 'configs/sweep/missing.yaml'",
    ),
    Case(
        "sweep_file_of_another_pair",
        _set("pairs.tiny.sweep.config", "configs/sweep/paper_A.yaml"),
        "pairs.tiny.sweep.config: configs/sweep/paper_A.yaml sweeps pair 'A' (its `pair`), not 'tiny'",
    ),
    Case(
        "sweep_file_of_another_driver",
        _set("pairs.tiny.sweep.config", "configs/sweep/tiny-verl.yaml"),
        "driver: 'verl' is not the driver of pair 'tiny', 'local'",
        where="configs/sweep/tiny-verl.yaml",
        files={"configs/sweep/tiny-verl.yaml": _sweep_copy("driver: local", "driver: verl")},
    ),
    _broken_sweep_file(
        "sweep_worker_count", "n_workers: 2", "n_workers: two", "n_workers: 'two' is not of type 'integer'"
    ),
    _broken_sweep_file(
        "sweep_knob_out_of_range",
        "low: 0.0, high: 1.0}",
        "low: 0.0, high: 2.0}",
        "space.alpha.high=2.0 is out of range",
    ),
    _broken_sweep_file(
        "sweep_condition",
        "condition: method",
        "condition: method_same_sampler_x",
        "condition: 'method_same_sampler_x' has no configs/condition/method_same_sampler_x.yaml",
    ),
]


def _dry_run(case: Case, root: Path) -> tuple[Result, str, Path]:
    """`snakemake -n` on the case's config in a copy of the workflow of its own: the result, the config
    file and the copy."""
    workflow = Workflow(root)
    for path, (source, edit) in case.files.items():
        (root / path).write_text(edit((root / source).read_text()))
    config = copy.deepcopy(workflow.config(case.base))
    case.change(config)
    configfile = workflow.write_config(config, f"{case.id}.yaml")
    return workflow.snakemake("-n", "--configfile", configfile), configfile, root


@pytest.fixture(scope="module")
def dry_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The dry-run of every selected case, two at a time: each is a whole `snakemake` process (seconds)."""
    selected = [
        item.callspec.params["case"]
        for item in request.session.items
        if item.module is request.module and "case" in getattr(getattr(item, "callspec", None), "params", {})
    ]
    roots = [tmp_path_factory.mktemp(case.id) for case in selected]  # here: mktemp is not thread-safe
    with ThreadPoolExecutor(2) as pool:
        runs = pool.map(_dry_run, selected, roots)
        return {case.id: run for case, run in zip(selected, runs, strict=True)}


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_broken_config_fails_before_any_job_naming_the_file_and_field(dry_runs: dict, case: Case) -> None:
    result, configfile, root = dry_runs[case.id]
    assert result.returncode != 0, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    error = re.search(r"^WorkflowError in file .*:\n(.*)$", result.output, re.M)
    assert error, result.output[-3000:]
    assert error.group(1).startswith(f"{case.where or configfile}: "), error.group(1)
    assert case.message in error.group(1)
    assert "Job stats" not in result.output  # no job was planned
    assert not (root / "results").exists()


def test_the_schemas_data_sets_are_the_data_stages() -> None:
    """The dataset names the schema allows are `commrl prepare`'s and the data rules' (common.smk)."""
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    common = (REPO / "workflow" / "rules" / "common.smk").read_text()
    files = ast.literal_eval(re.search(r"^DATASET_FILES = (\{.*?^\})", common, re.M | re.S).group(1))
    assert set(schema["$defs"]["dataset_name"]["enum"]) == set(DATASETS) == set(files)
