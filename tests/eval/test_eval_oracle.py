"""Scoring through the whole runner with ``OracleLM``, whose right answers are known exactly.

The oracle is a stand-in for a model (an lm-eval ``LM`` with no weights) so the expected accuracies are
exact; lm-eval, the generated tasks, math-verify and the MLflow store are real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_oracle import OracleLM

from commrl import tracking
from commrl.errors import ConfigError
from commrl.eval import evaluate_checkpoint


def _evaluate(tmp_path: Path, benchmark: str, data: Path, mlflow_uri: str, lm: OracleLM, **kwargs) -> dict:
    return evaluate_checkpoint(
        tmp_path / "oracle",
        benchmark,
        out=tmp_path / "eval" / f"{benchmark}.json",
        data=data,
        tracking_uri=mlflow_uri,
        lm=lm,
        **kwargs,
    )


def test_greedy_oracle_scores_one(tmp_path, toy_jsonl, mlflow_uri):
    summary = _evaluate(tmp_path, "toy_greedy", toy_jsonl, mlflow_uri, OracleLM())
    assert summary["metrics"]["acc"] == 1.0
    assert summary["n_docs"] == 6
    assert summary["kind"] == "greedy"
    written = json.loads((tmp_path / "eval" / "toy_greedy.json").read_text())
    assert written == summary
    samples = [json.loads(line) for line in Path(summary["samples_path"]).read_text().splitlines()]
    assert len(samples) == 6 and all(s["acc"] == 1.0 for s in samples)
    results = json.loads(Path(summary["results_path"]).read_text())
    assert results["results"]["toy_greedy"]["acc,greedy"] == 1.0


def test_greedy_oracle_wrong_scores_zero(tmp_path, toy_jsonl, mlflow_uri):
    summary = _evaluate(tmp_path, "toy_greedy", toy_jsonl, mlflow_uri, OracleLM(right_of_k=lambda doc: 0))
    assert summary["metrics"]["acc"] == 0.0


def test_avg8_keeps_all_samples_and_scores_known_fractions(tmp_path, toy_jsonl, mlflow_uri):
    """Right on 3 of 8 samples for even problems and 0 of 8 for odd ones: avg@8 = 3/16, pass@8 = 1/2."""
    oracle = OracleLM(right_of_k=lambda doc: 3 if doc % 2 == 0 else 0)
    summary = _evaluate(tmp_path, "toy_avg8", toy_jsonl, mlflow_uri, oracle, limit=4)
    assert summary["metrics"]["acc"] == pytest.approx(3 / 16)
    assert summary["metrics"]["pass_at_8"] == pytest.approx(0.5)
    assert summary["n_docs"] == 4 and summary["samples_per_problem"] == 8
    assert sum(oracle.seen.values()) == 32 and set(oracle.seen.values()) == {8}
    samples = [json.loads(line) for line in Path(summary["samples_path"]).read_text().splitlines()]
    assert [len(s["filtered_resps"][0]) for s in samples] == [8, 8, 8, 8]  # take_first_k keeps all 8
    assert [s["acc"] for s in samples] == [3 / 8, 0.0, 3 / 8, 0.0]


def test_mc_oracle_picks_the_right_letter(tmp_path, toy_jsonl, mlflow_uri):
    summary = _evaluate(tmp_path, "toy_mc", toy_jsonl, mlflow_uri, OracleLM())
    assert summary["metrics"]["acc"] == 1.0
    assert summary["scoring"] == "loglikelihood multiple choice"
    assert summary["max_gen_toks"] is None


def test_chat_template_and_system_prompt_reach_the_model(tmp_path, toy_jsonl, mlflow_uri):
    oracle = OracleLM()
    _evaluate(
        tmp_path,
        "toy_greedy",
        toy_jsonl,
        mlflow_uri,
        oracle,
        limit=2,
        settings_overrides={"system_prompt": "Be brief."},
    )
    rows = [json.loads(line) for line in toy_jsonl.read_text().splitlines()]
    assert oracle.contexts[0] == f"<system>Be brief.</system><user>{rows[0]['prompt']}</user><assistant>"


def test_results_land_in_mlflow_nested_under_the_training_run(tmp_path, toy_jsonl, mlflow_uri, training_run):
    summary = _evaluate(
        tmp_path,
        "toy_avg8",
        toy_jsonl,
        mlflow_uri,
        OracleLM(right_of_k=lambda d: 4),
        run_id=training_run,
        limit=2,
    )
    c = tracking.client(mlflow_uri)
    run = c.get_run(summary["mlflow_run_id"])
    tags = run.data.tags
    assert tags["mlflow.parentRunId"] == training_run and tags["training_run_id"] == training_run
    assert tags["kind"] == "eval" and tags["benchmark"] == "toy_avg8" and tags["pair"] == "tiny"
    assert tags["checkpoint"] == str((tmp_path / "oracle").resolve())
    assert tags["condition"] == "method" and tags["seed"] == "0"
    assert run.info.run_name == "tiny/method/seed0/eval/toy_avg8"
    assert run.info.status == "FINISHED"
    assert run.info.experiment_id == c.get_run(training_run).info.experiment_id
    assert run.data.metrics["eval/toy_avg8/acc"] == pytest.approx(0.5)
    assert run.data.metrics["eval/toy_avg8/pass_at_8"] == 1.0
    params = run.data.params
    assert params["kind"] == "avg@k" and params["repeats"] == "8" and params["num_fewshot"] == "0"
    assert params["generation.temperature"] == "0.7" and params["generation.do_sample"] == "True"
    assert params["generation.max_gen_toks"] == "24"
    assert "seed" not in {k.split(".")[-1] for k in params if k.startswith("generation.")}
    assert params["lm_eval_version"] == "0.4.13" and params["chat_template_sha"]
    assert params["seeds.random_seed"] == "0" and params["scoring"].startswith("math-verify")
    artifacts = {a.path for a in c.list_artifacts(run.info.run_id, "eval")}
    assert {
        "eval/summary.json",
        "eval/toy_avg8.results.json",
        "eval/toy_avg8.samples.jsonl",
        "eval/toy_avg8.task",
    } <= artifacts
    task_files = {a.path for a in c.list_artifacts(run.info.run_id, "eval/toy_avg8.task")}
    assert "eval/toy_avg8.task/toy_avg8.yaml" in task_files
    logged = c.download_artifacts(run.info.run_id, "eval/summary.json", str(tmp_path / "dl"))
    assert json.loads(Path(logged).read_text())["mlflow_run_id"] == run.info.run_id


def test_mc_params_say_loglikelihood(tmp_path, toy_jsonl, mlflow_uri, training_run):
    summary = _evaluate(tmp_path, "toy_mc", toy_jsonl, mlflow_uri, OracleLM(), run_id=training_run, limit=2)
    params = tracking.client(mlflow_uri).get_run(summary["mlflow_run_id"]).data.params
    assert params["scoring"] == "loglikelihood multiple choice"
    assert params["generation"] == "none (loglikelihood)"


def test_killed_evaluation_leaves_no_summary_and_no_run(tmp_path, toy_jsonl, mlflow_uri):
    out = tmp_path / "eval" / "toy_greedy.json"
    with pytest.raises(RuntimeError, match="killed"):
        _evaluate(tmp_path, "toy_greedy", toy_jsonl, mlflow_uri, OracleLM(fail_after=2))
    assert not out.exists()
    tags = {"kind": "eval", "benchmark": "toy_greedy", "checkpoint": str(tmp_path / "oracle")}
    assert not tracking.find_runs(tracking.experiment_name("tiny"), tags, mlflow_uri)


def test_metrics_and_problem_counts():
    """lm-eval's metric keys without their filter, its non-numeric entries left out; the problems scored."""
    from commrl.eval.runner import effective_docs, extract_metrics

    results = {
        "results": {"commrl_math500": {"alias": "math500", "acc,greedy": 0.25, "acc_stderr,greedy": "N/A"}},
        "n-samples": {"commrl_math500": {"original": 500, "effective": 6}},
    }
    assert extract_metrics(results, "commrl_math500") == {"acc": 0.25}
    assert effective_docs(results, "commrl_math500") == 6


def test_data_parallel_engines_are_refused_for_sampled_benchmarks(tmp_path, toy_jsonl, mlflow_uri):
    """lm-eval seeds every data-parallel vLLM engine alike and deals a problem's k repeats to them alike:
    they would draw the same samples, so avg@k with data_parallel_size > 1 is refused; greedy runs."""
    two = {"data_parallel_size": 2}
    with pytest.raises(ConfigError, match=r"eval\.data_parallel_size=2 with sampled benchmarks \(toy_avg8\)"):
        _evaluate(tmp_path, "toy_avg8", toy_jsonl, mlflow_uri, OracleLM(), settings_overrides=two)
    summary = _evaluate(tmp_path, "toy_greedy", toy_jsonl, mlflow_uri, OracleLM(), settings_overrides=two)
    assert summary["metrics"]["acc"] == 1.0


def test_several_sampled_benchmarks_in_one_gpu_job_are_refused(tmp_path, monkeypatch):
    """On a GPU vLLM samples in an engine process of its own, which lm-eval's reseed before each benchmark
    does not reach: a second sampled benchmark in the job would draw other samples than alone. Refused
    before any model loads (no GPU here: ``on_cpu`` says otherwise); in-process engines pass the check."""
    from commrl.eval.benchmarks import get_benchmark
    from commrl.eval.runner import _check_reseeding, evaluate_benchmarks

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    monkeypatch.setattr("commrl.rl.vllm_env.on_cpu", lambda: False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    both = ["commrl_aime24", "commrl_aime25"]
    refused = r"sampled benchmarks commrl_aime24, commrl_aime25 in one job on a GPU"
    with pytest.raises(ConfigError, match=refused):
        evaluate_benchmarks(tmp_path / "ckpt", both, backend="vllm")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    _check_reseeding([get_benchmark(n) for n in both], "vllm")  # the engine in this process: reseeded
