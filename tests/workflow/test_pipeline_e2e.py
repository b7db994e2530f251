"""The default pipeline for real: `snakemake --cores 2` on the tiny pair, from nothing to the report.

One run of the whole DAG (data, base policy, five training runs of one seed, evaluations, the Optuna sweep,
the report) in a private copy of the workflow, under the fork server as `make pipeline` runs it; the tests
below read what it produced. This is the check CI
relies on for the tiny pipeline end to end (marker ``e2e``; ~7 minutes on 2 cores).
"""

from __future__ import annotations

import csv
import json
import re

import pytest
import yaml
from PIL import Image
from snakemake_run import Workflow

from commrl import tracking
from commrl.cli.main import main
from commrl.run import forkserver

pytestmark = pytest.mark.e2e

# The default matrix less no_projection, anchor_off, anchor_only, prf_mask, dropout and method_same_sampler
# (each the same trainer path with other method, model or sampler flags, trained in tests/rl and
# tests/compression), with two of the six async conditions (bypass mode compressed, decoupled mode with TIS;
# dense_async is bypass mode with the identity codec, tests/rl/test_async.py): the full matrix is test_dag's
# dry run; one seed, these four conditions and a 2-trial sweep keep the suite inside its 20 minutes.
CONDITIONS = ("dense", "method", "method_async", "method_async_tis")
SWEEP_TRIALS = 2
# dense and method train the default's 40 ticks (the learning check, the evaluation); the two async runs
# train 10 (read at 10, validated at 0 and 10), and only method is evaluated: the suite's budget.
TICKS = {condition: 40 if condition in ("dense", "method") else 10 for condition in CONDITIONS}
EVALUATED = ("method",)
BENCHMARKS = ("toy_greedy", "toy_avg8", "toy_mc")
# The three benchmarks read the first 64 problems of the toy test split (the default reads all 500, most of
# an evaluation job's time here): the job, its files and MLflow runs are the same.
EVAL_ROWS = 64


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Workflow:
    """The default pipeline with one seed per condition (the default's three would triple CI's time); the
    Snakemake output is kept as `pipeline.result`."""
    wf = Workflow(tmp_path_factory.mktemp("tiny-pipeline"))
    config = wf.config()
    config["pairs"]["tiny"]["seeds"] = [0]
    config["pairs"]["tiny"]["conditions"] = list(CONDITIONS)
    config["pairs"]["tiny"]["ticks"] = {c: t for c, t in TICKS.items() if t != 40}
    config["pairs"]["tiny"]["eval"]["conditions"] = list(EVALUATED)
    toy = wf.root / "e2e" / "toy"  # what prepare_toy writes to results/data/toy, made here to cut its test
    assert (
        main(
            [
                "prepare",
                "--dataset",
                "toy",
                "--seed",
                str(config["datasets"]["toy"]["seed"]),
                "--out",
                str(toy),
            ]
        )
        == 0
    )
    rows = (toy / "test.jsonl").read_text().splitlines(keepends=True)[:EVAL_ROWS]
    (wf.root / "e2e" / "toy_test64.jsonl").write_text("".join(rows))
    for name in BENCHMARKS:
        config["pairs"]["tiny"]["eval"]["benchmarks"][name]["data"] = "e2e/toy_test64.jsonl"
    sweep = yaml.safe_load((wf.root / "configs/sweep/tiny.yaml").read_text())
    sweep.update(n_trials=SWEEP_TRIALS, ticks=10, read_at=10)  # the sweep's 20-tick trials halved
    sweep["pruner"]["n_warmup_steps"] = 5  # halved too: the pruner may stop a trial at its tick-5 validation
    (wf.root / "configs/sweep/e2e.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))
    config["pairs"]["tiny"]["sweep"]["config"] = "configs/sweep/e2e.yaml"
    wf.configfile = wf.write_config(config, "one-seed.yaml")
    result = wf.snakemake("--cores", "2", timeout=2400, forkserver=True)  # as `make pipeline` runs it
    assert result.returncode == 0, result.output[-5000:]
    served = forkserver.served_jobs(result.output)
    steps = int(re.findall(r"(\d+) of \d+ steps \(100%\) done", result.output)[-1])
    assert served == steps - 1, result.output[-3000:]  # every job but `all` ran as a fork of the server
    wf.result = result
    return wf


def _uri(wf: Workflow) -> str:
    return f"sqlite:///{wf.root / 'results' / 'mlflow.db'}"


def test_base_policy_lands_in_its_accuracy_window(pipeline):
    acc = json.loads((pipeline.root / "results/models/tiny-base/base_accuracy.json").read_text())
    assert 0.25 <= acc["greedy_acc"] <= 0.50
    assert acc["pass_rate_t1"] > 0.05  # GRPO needs groups with mixed rewards


def test_every_run_trained_every_tick_and_is_tracked(pipeline):
    client = tracking.client(_uri(pipeline))
    for condition in CONDITIONS:
        summary = json.loads(
            (pipeline.root / f"results/runs/tiny/{condition}/seed0/summary.json").read_text()
        )
        ticks = TICKS[condition]
        assert summary["ticks_trained"] == summary["ticks_asked"] == ticks, condition
        run = client.get_run(summary["mlflow_run_id"])
        assert run.info.status == "FINISHED"
        assert run.data.tags["condition"] == condition and run.data.tags["pair"] == "tiny"
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "score/mean"))
        assert steps == list(range(1, ticks + 1)), condition
        vals = sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/acc"))
        assert vals == list(range(0, ticks + 1, 10)), condition


def test_the_dense_run_learns(pipeline):
    client = tracking.client(_uri(pipeline))
    summary = json.loads((pipeline.root / "results/runs/tiny/dense/seed0/summary.json").read_text())
    val = {m.step: m.value for m in client.get_metric_history(summary["mlflow_run_id"], "val/acc")}
    assert max(val.values()) >= val[0] + 0.1


def test_evaluations_are_nested_under_their_training_runs(pipeline):
    client = tracking.client(_uri(pipeline))
    for condition in EVALUATED:
        run_id = json.loads(
            (pipeline.root / f"results/runs/tiny/{condition}/seed0/summary.json").read_text()
        )["mlflow_run_id"]
        for benchmark in BENCHMARKS:
            out = json.loads(
                (pipeline.root / f"results/eval/tiny/{condition}/seed0/{benchmark}.json").read_text()
            )
            assert out["benchmark"] == benchmark
            children = client.search_runs(
                [client.get_run(run_id).info.experiment_id],
                filter_string=f"tags.mlflow.parentRunId = '{run_id}' and tags.benchmark = '{benchmark}'",
            )
            assert len(children) == 1 and f"eval/{benchmark}/acc" in children[0].data.metrics


def test_the_sweep_used_exactly_its_budget(pipeline):
    summary = pipeline.root / "results/sweeps/tiny/tiny-method/summary"
    with open(summary / "trials.csv") as fh:
        states = [row["state"] for row in csv.DictReader(fh)]
    assert sum(s in ("COMPLETE", "PRUNED") for s in states) == SWEEP_TRIALS
    assert json.loads((summary / "best_params.json").read_text())


def test_the_report_has_the_figures_and_the_claims(pipeline):
    report = pipeline.root / "results/report"
    pngs = sorted(report.glob("fig*.png"))
    assert len(pngs) >= 8
    for png in pngs:
        with Image.open(png) as img:
            assert img.format == "PNG" and img.size[0] > 300
    claims = json.loads((report / "claims.json").read_text())
    assert len(claims["pairs"]["tiny"]) == 15
    assert {c["status"] for c in claims["pairs"]["tiny"]} <= {"INCONCLUSIVE", "n/a"}  # one seed: no interval
    assert "Claims" in (report / "report.md").read_text()


def test_one_benchmark_on_one_checkpoint_is_one_job(pipeline):
    """The tiny pair's eval.job_per is checkpoint: one job evaluated the pair's three benchmarks, with
    one model, each into its own summary."""
    assert pipeline.result.counts()["eval_tiny"] == len(EVALUATED)
    for name in BENCHMARKS:
        summary = json.loads((pipeline.root / f"results/eval/tiny/method/seed0/{name}.json").read_text())
        assert summary["benchmark"] == name and summary["backend"] == "vllm"
        assert summary["checkpoint"].endswith("method/seed0/final")


def test_a_finished_pipeline_has_nothing_left_to_do(pipeline):
    result = pipeline.snakemake("-n", "--cores", "2")
    assert result.returncode == 0
    assert "Nothing to be done" in result.output
