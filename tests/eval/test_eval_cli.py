"""``commrl eval`` end to end (tiny model, hf backend, real MLflow store) and its error messages."""

from __future__ import annotations

import json

import pytest

from commrl import tracking
from commrl.cli.main import main
from commrl.run.summary import RunSummary


def test_eval_cli_writes_the_summary_and_nests_under_the_training_run(
    tmp_path, tiny_model_dir, toy_jsonl, mlflow_uri, training_run, capsys
):
    trained = RunSummary("tiny", "method", 0, "local", 60, 60, training_run, None, 60, None)
    summary_file = trained.write(tmp_path / "run")
    out = tmp_path / "eval" / "tiny" / "method" / "seed0" / "toy_greedy.json"
    argv = (
        f"eval --checkpoint {tiny_model_dir} --benchmark toy_greedy --data {toy_jsonl} --limit 2 "
        f"--summary {summary_file} --max-gen-toks 8 --out {out} --tracking-uri {mlflow_uri}"
    )
    rc = main(argv.split())
    assert rc == 0
    assert "toy_greedy on" in capsys.readouterr().out
    summary = json.loads(out.read_text())
    assert (summary["n_docs"], summary["max_gen_toks"], summary["training_run_id"]) == (2, 8, training_run)
    assert out.with_name("toy_greedy.results.json").is_file()
    samples = [json.loads(x) for x in out.with_name("toy_greedy.samples.jsonl").read_text().splitlines()]
    assert samples[0]["arguments"][0][1]["max_gen_toks"] == 8
    assert samples[0]["arguments"][0][0].startswith("<|im_start|>user\n")  # the model's chat template
    run = tracking.client(mlflow_uri).get_run(summary["mlflow_run_id"])
    assert run.data.tags["mlflow.parentRunId"] == training_run
    assert run.data.metrics["eval/toy_greedy/acc"] == summary["metrics"]["acc"]
    assert run.data.params["model_args.pretrained"] == str(tiny_model_dir)


def _fails(capsys, argv: str) -> str:
    assert main(["eval", *argv.split()]) == 2
    return capsys.readouterr().err


def test_missing_dataset_is_a_clear_error_before_the_model_loads(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "aime.json"
    err = _fails(capsys, f"--checkpoint {tiny_model_dir} --benchmark commrl_aime24 --out {out}")
    assert "no pair for benchmark(s) commrl_aime24: the response budget" in err  # not tiny's 24 tokens
    assert "pass --pair (A, B, ...) or the training run (--summary or --run-id)" in err
    err = _fails(capsys, f"--checkpoint {tiny_model_dir} --benchmark commrl_aime24 --out {out} --pair A")
    assert "error: benchmark commrl_aime24: cannot load hub dataset 'Maxwell-Jia/AIME_2024'" in err
    assert "--data PATH" in err and "HF_HUB_OFFLINE=1" in err
    assert not out.exists() and not list(tmp_path.iterdir())
    err = _fails(capsys, f"--checkpoint {tiny_model_dir} --benchmark toy_greedy")
    assert "toy_greedy reads a local file and none was given: pass --data PATH" in err


def test_bad_requests_name_the_value(tmp_path, tiny_model_dir, toy_jsonl, capsys):
    err = _fails(capsys, f"--checkpoint {tmp_path} --benchmark toy_greedy --data {toy_jsonl}")
    assert f"checkpoint {tmp_path} is not a model directory" in err
    err = _fails(
        capsys, f"--checkpoint {tiny_model_dir} --benchmark toy_greedy --summary {tmp_path}/none.json"
    )
    assert "none.json does not exist" in err
    (tmp_path / "old.json").write_text(json.dumps({"mlflow_run_id": "abc", "final_dir": str(tiny_model_dir)}))
    err = _fails(capsys, f"--benchmark toy_greedy --data {toy_jsonl} --summary {tmp_path}/old.json")
    assert "old.json lacks pair, condition, seed, driver, ticks_asked, ticks_trained, read_at" in err
    short = RunSummary("tiny", "method", 0, "local", 40, 20, None, str(tiny_model_dir), 40, None)
    err = _fails(capsys, f"--benchmark toy_greedy --data {toy_jsonl} --summary {short.write(tmp_path / 's')}")
    assert "records no model at the read tick 40 (trained 20 of 40 ticks)" in err
    err = _fails(capsys, f"--checkpoint {tiny_model_dir} --benchmark toy_greedy --data {toy_jsonl} --pair Z")
    assert "pair 'Z' has no eval settings" in err
    err = _fails(capsys, f"--checkpoint {tiny_model_dir} --benchmark toy_greedy --data {toy_jsonl} --limit 0")
    assert "limit=0 must be >= 1" in err
    with pytest.raises(SystemExit):
        main(["eval", "--checkpoint", str(tiny_model_dir), "--benchmark", "aime24"])
    assert "invalid choice: 'aime24'" in capsys.readouterr().err


def test_unknown_training_run_and_mmlu_without_cache(tmp_path, tiny_model_dir, toy_jsonl, mlflow_uri, capsys):
    argv = (
        f"--checkpoint {tiny_model_dir} --benchmark toy_greedy --data {toy_jsonl} --tracking-uri {mlflow_uri}"
    )
    err = _fails(capsys, f"{argv} --run-id 0123456789abcdef")
    assert "training run '0123456789abcdef' is not in the MLflow store" in err
    mmlu = f"--checkpoint {tiny_model_dir} --benchmark commrl_mmlu_stem --pair A"
    err = _fails(capsys, mmlu)
    assert "commrl_mmlu_stem: cannot load hub dataset 'cais/mmlu', config 'all'" in err
    err = _fails(capsys, f"{mmlu} --data {toy_jsonl}")
    assert "no subject column to select abstract_algebra" in err  # the toy rows are not MMLU's


def test_several_benchmarks_with_one_model_equal_one_job_each(
    tmp_path, tiny_model_dir, toy_jsonl, mlflow_uri, capsys
):
    """``--benchmark`` repeated builds the model once; each benchmark's summary, results and samples are
    those of its own ``commrl eval`` (lm-eval reseeds before each; toy_avg8 samples at T = 0.7)."""
    names = ("toy_greedy", "toy_avg8", "toy_mc")
    common = f"--checkpoint {tiny_model_dir} --limit 3 --max-gen-toks 6 --tracking-uri {mlflow_uri}"
    for name in names:
        out = tmp_path / "alone" / f"{name}.json"
        assert main(f"eval {common} --benchmark {name} --data {toy_jsonl} --out {out}".split()) == 0
    grouped = " ".join(f"--benchmark {name} --data {name}={toy_jsonl}" for name in names)
    assert main(f"eval {common} {grouped} --out-dir {tmp_path / 'together'}".split()) == 0
    printed = capsys.readouterr().out
    for name in names:
        alone, together = (
            json.loads((tmp_path / d / f"{name}.json").read_text()) for d in ("alone", "together")
        )
        assert together["metrics"] == alone["metrics"] and together["backend"] == alone["backend"] == "hf"
        assert together["mlflow_run_id"] != alone["mlflow_run_id"]  # an MLflow run each
        rows = [
            [
                json.loads(line)["resps"]
                for line in (tmp_path / d / f"{name}.samples.jsonl").read_text().splitlines()
            ]
            for d in ("alone", "together")
        ]
        assert rows[0] == rows[1]
        results = json.loads((tmp_path / "together" / f"{name}.results.json").read_text())
        assert results["config"]["model"] == "hf" and results["model_source"] == "hf"
        assert results["config"]["model_args"]["pretrained"] == str(tiny_model_dir)
        assert f"{name} on" in printed


def test_several_benchmarks_check_their_options_before_the_model_loads(
    tmp_path, tiny_model_dir, toy_jsonl, capsys
):
    base = f"--checkpoint {tiny_model_dir} --benchmark toy_greedy --benchmark toy_mc"
    err = _fails(capsys, f"{base} --data {toy_jsonl} --out {tmp_path}/x.json")
    assert "--out names one benchmark's file; give --out-dir DIR" in err
    err = _fails(capsys, f"{base} --data toy_avg8={toy_jsonl} --out-dir {tmp_path}/o")
    assert "--data toy_avg8=" in err and "is not one of the --benchmark names" in err
    err = _fails(capsys, f"{base} --data toy_greedy={toy_jsonl} --out-dir {tmp_path}/o")
    assert "toy_mc reads a local file and none was given" in err
    assert not (tmp_path / "o").exists()
    err = _fails(
        capsys, f"--checkpoint {tiny_model_dir} --benchmark toy_mc --benchmark toy_mc --data {toy_jsonl}"
    )
    assert "names a benchmark twice" in err
