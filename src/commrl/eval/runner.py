"""Evaluate one checkpoint on one benchmark through lm-eval's Python API, then record the result;
``evaluate_benchmarks`` evaluates one checkpoint on several with one model (one import, one engine build).

Order of work, so that a failure costs little and a killed evaluation leaves no ``out`` file:

1. resolve the benchmark, the pair's settings and the training run to nest under (if any);
2. read the benchmark's problems (a missing dataset fails here, before any model loads) and write the
   generated task (``<out stem>.task/``);
3. run ``lm_eval.simple_evaluate`` (hf or vLLM backend, the pair's chat template and system prompt);
4. write the full lm-eval results (``<out stem>.results.json``) and the per-sample log
   (``<out stem>.samples.jsonl``), log the MLflow run, and write the compact summary to ``out`` last.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from commrl import tracking
from commrl.errors import ConfigError
from commrl.eval import mlflow_log, overlong
from commrl.eval.atomic import write_lines_atomic, write_text_atomic
from commrl.eval.benchmarks import AVG_K, MC, Benchmark, get_benchmark
from commrl.eval.errors import EvalError, TrainingRunError
from commrl.eval.lmeval_task import write_task_dir
from commrl.eval.pairs import PairSettings, pair_settings
from commrl.eval.problems import build_docs, load_rows
from commrl.eval.vllm_backend import CPU_KV_CACHE_GIB
from commrl.rl.vllm_env import cpu_engine_args, on_cpu

if TYPE_CHECKING:
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager
    from mlflow.entities import Run

BACKENDS = ("hf", "vllm")
SEEDS = {"random_seed": 0, "numpy_random_seed": 1234, "torch_random_seed": 1234, "fewshot_random_seed": 1234}


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """An lm-eval model built once for several benchmarks: the LM, its backend and its ``model_args``."""

    lm: LM
    backend: str
    args: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class OutputPaths:
    """Where one evaluation writes: the summary (``out``) and, beside it, the results, samples and task."""

    summary: Path | None
    results: Path
    samples: Path
    task_dir: Path

    @classmethod
    def beside(cls, out: str | Path | None, scratch: Path, benchmark: str) -> OutputPaths:
        base = Path(out).resolve() if out is not None else scratch / f"{benchmark}.json"
        stem = base.with_suffix("")
        return cls(
            summary=base if out is not None else None,
            results=stem.with_name(f"{stem.name}.results.json"),
            samples=stem.with_name(f"{stem.name}.samples.jsonl"),
            task_dir=stem.with_name(f"{stem.name}.task"),
        )


def evaluate_checkpoint(
    checkpoint: str | Path,
    benchmark: str,
    backend: str = "hf",
    out: str | Path | None = None,
    *,
    pair: str | None = None,
    run_id: str | None = None,
    limit: int | None = None,
    max_gen_toks: int | None = None,
    data: str | Path | None = None,
    prompt_template: str | None = None,
    config: str | Path | None = None,
    settings_overrides: dict[str, Any] | None = None,
    tracking_uri: str | None = None,
    log_to_mlflow: bool = True,
    lm: LM | LoadedModel | None = None,
) -> dict[str, Any]:
    """Evaluate ``checkpoint`` (an HF model directory) on ``benchmark``; the summary dict (also at ``out``).

    ``pair`` selects the evaluation settings (``commrl.eval.pairs``; default: the training run's ``pair``
    tag, else the benchmark's own pair: tiny for the toy benchmarks, none for the paper ones); the keys of
    YAML file ``config``, then ``settings_overrides``, then ``max_gen_toks`` (the response budget) override
    them. ``run_id`` is the training run to nest the MLflow run under. ``data`` is a local problems file
    (else the benchmark's hub dataset); ``prompt_template`` (with ``{problem}``) replaces the data's
    ``prompt`` column. ``lm`` is an ``lm_eval.api.model.LM`` instance to evaluate instead of loading
    ``checkpoint`` with ``backend``, or a ``LoadedModel`` of ``checkpoint`` (``evaluate_benchmarks``:
    recorded as its backend, as if this call had loaded it).
    """
    bench = get_benchmark(benchmark)
    ckpt = _checked_request(checkpoint, backend, limit, loads_model=lm is None)
    uri, parent, pair, settings = _resolved_settings(
        [bench], pair, run_id, tracking_uri, log_to_mlflow, config, settings_overrides, max_gen_toks
    )

    start = time.time()
    with tempfile.TemporaryDirectory(prefix="commrl-eval-") as scratch:
        paths = OutputPaths.beside(out, Path(scratch), bench.name)
        task_manager, source, prompt = _prepare_task(bench, data, prompt_template, settings, paths.task_dir)
        model, model_args = _model(lm, backend, ckpt, settings)
        results, samples = _run_lm_eval(model, model_args, bench, task_manager, settings, limit, backend)

        metrics = extract_metrics(results, bench.name)
        max_gen_toks = settings.max_gen_toks if bench.kind != MC else None
        tokenizer = overlong.checkpoint_tokenizer(ckpt)
        n_overlong = (
            None
            if tokenizer is None
            else overlong.count_overlong(samples, tokenizer, settings.max_model_len, max_gen_toks)
        )
        write_text_atomic(paths.results, json.dumps(results, indent=2, default=_jsonable, ensure_ascii=False))
        write_lines_atomic(paths.samples, _sample_lines(samples))
        backend_name = _backend_name(lm, backend)
        summary: dict[str, Any] = {
            "benchmark": bench.name,
            "kind": bench.kind,
            "scoring": bench.scoring,
            "metrics": {tracking.metric_key(k): v for k, v in metrics.items()},
            "n_docs": effective_docs(results, bench.name),
            "samples_per_problem": bench.k,
            "limit": limit,
            "checkpoint": str(ckpt),
            "backend": backend_name,
            "pair": pair,
            "max_gen_toks": max_gen_toks,
            "overlong_prompts": n_overlong,
            "data_source": source,
            "results_path": str(paths.results) if out is not None else None,
            "samples_path": str(paths.samples) if out is not None else None,
            "task_dir": str(paths.task_dir) if out is not None else None,
            "training_run_id": parent.info.run_id if parent is not None else run_id,
            "mlflow_run_id": None,
            "tracking_uri": uri if log_to_mlflow else None,
            "lm_eval_version": importlib.metadata.version("lm_eval"),
            "seconds": round(time.time() - start, 2),
        }
        if n_overlong:
            print(
                overlong.warning(bench.name, n_overlong, summary["n_docs"], settings.max_model_len),
                file=sys.stderr,
            )
        if log_to_mlflow:
            artifacts = [paths.results, paths.samples, paths.task_dir]
            mlflow_log.log_evaluation(
                benchmark=bench.name,
                pair=pair,
                checkpoint=str(ckpt),
                backend=backend_name,
                metrics=metrics,
                params={
                    **run_params(bench, settings, model_args, results, backend_name, source, prompt, limit),
                    "overlong_prompts": "unknown" if n_overlong is None else n_overlong,
                },
                summary=summary,
                artifacts=artifacts,
                tracking_uri=uri,
                parent=parent,
            )
        if paths.summary is not None:
            write_text_atomic(paths.summary, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


def _resolve_pair(pair: str | None, parent: Run | None, benchmarks: list[Benchmark]) -> str:
    """``pair``, else the training run's ``pair`` tag, else the benchmarks' own pair (tiny for the toy
    ones); a paper benchmark with none of them is an error, not tiny's 24-token budget."""
    parent_pair = parent.data.tags.get("pair") if parent is not None else None
    if pair and parent_pair and pair != parent_pair:
        raise TrainingRunError(
            f"--pair {pair} does not match the training run's pair tag {parent_pair!r} "
            f"(run {parent.info.run_id}); drop --pair or fix --run-id"
        )
    if pair or parent_pair:
        return pair or parent_pair
    own = {b.pair for b in benchmarks}
    if len(own) == 1 and None not in own:
        return own.pop()
    names = [b.name for b in benchmarks if b.pair is None] or [b.name for b in benchmarks]
    unpaired = ", ".join(names)
    raise ConfigError(
        f"no pair for benchmark(s) {unpaired}: the response budget, context length and dtype are a pair's; "
        "pass --pair (A, B, ...) or the training run (--summary or --run-id)"
    )


def _prepare_task(
    bench: Benchmark,
    data: str | Path | None,
    prompt_template: str | None,
    settings: PairSettings,
    task_dir: Path,
) -> tuple[TaskManager, str, str]:
    """Read the problems (failing early on a missing dataset) and build the lm-eval ``TaskManager``.

    Returns the task manager, the data source and how the prompt was made, in words.
    """
    rows, source = load_rows(bench, data)
    docs = build_docs(bench, rows, source, prompt_template)
    write_task_dir(bench, docs, settings.max_gen_toks, task_dir)
    if bench.kind == MC:
        prompt = "multiple choice (commrl.eval.problems.multiple_choice_doc)"
    elif prompt_template is None and "prompt" in rows[0]:
        prompt = "the data's prompt column"
    else:
        prompt = prompt_template or bench.prompt_template
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(task_dir), include_defaults=False), source, prompt


def backend_model_args(backend: str, checkpoint: Path, settings: PairSettings) -> dict[str, Any]:
    """lm-eval ``model_args`` of ``backend`` for ``checkpoint`` under the pair's settings."""
    if backend == "hf":
        return {"pretrained": str(checkpoint), "dtype": settings.dtype, "max_length": settings.max_model_len}
    args = {
        "pretrained": str(checkpoint),
        "dtype": settings.dtype,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "data_parallel_size": settings.data_parallel_size,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "max_model_len": settings.max_model_len,
        "enforce_eager": settings.enforce_eager,
        "seed": settings.seed,
    }
    if on_cpu():
        args |= cpu_engine_args(checkpoint, settings.max_model_len, settings.dtype, CPU_KV_CACHE_GIB)
    return args


def evaluate_benchmarks(
    checkpoint: str | Path,
    benchmarks: list[str],
    backend: str = "hf",
    outs: dict[str, str | Path] | None = None,
    data: dict[str, str | Path | None] | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Evaluate ``checkpoint`` on each of ``benchmarks`` in turn with one model; their summaries, in order.

    The model is built once (one vLLM import and engine build instead of one per benchmark); each benchmark
    is then exactly what ``evaluate_checkpoint`` does for it alone: lm-eval reseeds Python, NumPy and torch
    before each (``SEEDS``; on GPUs that reaches vLLM's sampler only with its engine in this process, so
    several sampled benchmarks in one GPU job are refused: ``_check_reseeding``), and its files, summary and
    MLflow run are its own. ``outs`` and ``data`` map a
    benchmark to its ``out`` and ``data``; ``options`` are ``evaluate_checkpoint``'s other keywords.
    """
    if not benchmarks:
        raise ConfigError("give at least one benchmark")
    outs, data = outs or {}, data or {}
    if len(benchmarks) == 1:
        (name,) = benchmarks
        out, problems = outs.get(name), data.get(name)
        return [evaluate_checkpoint(checkpoint, name, backend, out, data=problems, **options)]
    chosen = [get_benchmark(name) for name in benchmarks]
    ckpt = _checked_request(checkpoint, backend, options.get("limit"), loads_model=True)
    _check_reseeding(chosen, backend)
    *_, settings = _resolved_settings(
        chosen,
        options.get("pair"),
        options.get("run_id"),
        options.get("tracking_uri"),
        options.get("log_to_mlflow", True),
        options.get("config"),
        options.get("settings_overrides"),
        options.get("max_gen_toks"),
    )
    for bench in chosen:  # every benchmark's problems are there before the model loads
        load_rows(bench, data.get(bench.name))
    loaded = load_model(backend, ckpt, settings)
    return [
        evaluate_checkpoint(ckpt, name, backend, outs.get(name), data=data.get(name), lm=loaded, **options)
        for name in benchmarks
    ]


def _sampled(benchmarks: list[Benchmark]) -> list[str]:
    """The names of the sampled (avg@k) benchmarks among ``benchmarks``."""
    return [b.name for b in benchmarks if b.kind == AVG_K]


def _check_reseeding(benchmarks: list[Benchmark], backend: str) -> None:
    """``ConfigError`` when lm-eval's reseed before each benchmark would not reach vLLM's sampler: on GPUs
    vLLM samples in an engine process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING``, default on; on a CPU
    commrl runs it in this process), seeded once at its start, so a sampled benchmark after another would
    draw other samples than in a job of its own (greedy ones draw none)."""
    from commrl.rl.vllm_env import on_cpu

    sampled = _sampled(benchmarks)
    in_process = on_cpu() or os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0"
    if backend == "vllm" and len(sampled) > 1 and not in_process:
        raise ConfigError(
            f"sampled benchmarks {', '.join(sampled)} in one job on a GPU: vLLM samples in its own engine "
            "process, which lm-eval's reseed before each benchmark does not reach, so each after the first "
            "would draw other samples than in a job of its own; evaluate them one per job "
            "(eval.job_per: benchmark), or export VLLM_ENABLE_V1_MULTIPROCESSING=0"
        )


def _resolved_settings(
    benchmarks: list[Benchmark],
    pair: str | None,
    run_id: str | None,
    tracking_uri: str | None,
    log_to_mlflow: bool,
    config: str | Path | None,
    settings_overrides: dict[str, Any] | None,
    max_gen_toks: int | None,
) -> tuple[str, Run | None, str, PairSettings]:
    """The tracking URI, the training run to nest under (if any), the pair and its evaluation settings."""
    uri = tracking_uri or tracking.default_tracking_uri()
    parent = mlflow_log.training_run(run_id, uri) if (run_id and log_to_mlflow) else None
    pair = _resolve_pair(pair, parent, benchmarks)
    settings = pair_settings(pair, config, **{**(settings_overrides or {}), "max_gen_toks": max_gen_toks})
    sampled = _sampled(benchmarks)
    if settings.data_parallel_size > 1 and sampled:
        raise ConfigError(
            f"eval.data_parallel_size={settings.data_parallel_size} with sampled benchmarks "
            f"({', '.join(sampled)}) is not supported: lm-eval gives every data-parallel engine the same "
            "seed and deals a problem's k repeats to them alike, so they draw the same samples (avg@k of "
            "k/D distinct ones); set data_parallel_size: 1 for them"
        )
    return uri, parent, pair, settings


def _checked_request(checkpoint: str | Path, backend: str, limit: int | None, *, loads_model: bool) -> Path:
    """The checkpoint's absolute path, once the backend, the model directory and ``limit`` are valid."""
    if loads_model and backend not in BACKENDS:
        raise ConfigError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
    ckpt = Path(checkpoint).resolve()
    if loads_model and not (ckpt / "config.json").is_file():
        raise EvalError(f"checkpoint {ckpt} is not a model directory (no config.json); pass a run's final/")
    if limit is not None and limit < 1:
        raise ConfigError(f"limit={limit} must be >= 1 (problems per task)")
    return ckpt


def load_model(backend: str, checkpoint: Path, settings: PairSettings) -> LoadedModel:
    """Build ``backend``'s lm-eval model of ``checkpoint`` as ``simple_evaluate`` would from its name."""
    import lm_eval.api.registry

    args = _model_args(backend, checkpoint, settings)
    lm = lm_eval.api.registry.get_model(backend).create_from_arg_obj(
        args,
        {
            "batch_size": _batch_size(settings, backend),
            "max_batch_size": None,
            "device": _device(),
        },
    )
    if backend == "vllm":
        from commrl.eval.vllm_backend import check_sampling

        check_sampling(lm)
    return LoadedModel(lm, backend, args)


def _backend_name(lm: LM | LoadedModel | None, backend: str) -> str:
    if lm is None:
        return backend
    if isinstance(lm, LoadedModel):
        return lm.backend
    return f"custom:{type(lm).__name__}"


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _batch_size(settings: PairSettings, backend: str) -> int | str:
    return settings.batch_size if backend == "hf" else "auto"


def _model(
    lm: LM | LoadedModel | None, backend: str, checkpoint: Path, settings: PairSettings
) -> tuple[LM | LoadedModel | str, dict]:
    if isinstance(lm, LoadedModel):
        return lm, lm.args
    if lm is not None:
        return lm, {}
    if backend == "vllm":  # built here, not by lm-eval from its name, so that its sampling is checked first
        loaded = load_model(backend, checkpoint, settings)
        return loaded, loaded.args
    return backend, backend_model_args(backend, checkpoint, settings)


def _model_args(backend: str, checkpoint: Path, settings: PairSettings) -> dict:
    """lm-eval's model arguments of ``checkpoint`` (vLLM's CPU variables set first)."""
    if backend == "vllm":
        from commrl.eval.vllm_backend import prepare_vllm

        prepare_vllm()
    return backend_model_args(backend, checkpoint, settings)


def _run_lm_eval(
    model: LM | LoadedModel | str,
    args: dict[str, Any],
    bench: Benchmark,
    task_manager: TaskManager,
    settings: PairSettings,
    limit: int | None,
    backend: str,
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """``simple_evaluate`` with the chat template and the pair's system prompt; (results, samples)."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker

    tracker = EvaluationTracker()
    loaded = model if isinstance(model, LoadedModel) else None
    results = lm_eval.simple_evaluate(
        model=loaded.lm if loaded else model,
        model_args=None if loaded else (args or None),
        tasks=[bench.name],
        task_manager=task_manager,
        batch_size=_batch_size(settings, backend),
        device=_device(),
        limit=limit,
        log_samples=True,
        evaluation_tracker=tracker,
        system_instruction=settings.system_prompt,
        apply_chat_template=True,
        **SEEDS,
    )
    if results is None:
        raise EvalError("lm-eval returned no results on this rank; run the evaluation as a single process")
    samples = results.pop("samples")
    config = tracker.general_config_tracker
    if loaded is not None:  # recorded as simple_evaluate records a model it built from its name
        results["config"].update(model=loaded.backend, model_args=loaded.args)
        config.log_experiment_args(
            model_source=loaded.backend,
            model_args=loaded.args,
            system_instruction=settings.system_prompt,
            chat_template=config.chat_template,
            fewshot_as_multiturn=config.fewshot_as_multiturn,
        )
    config.log_end_time()
    results["task_hashes"] = {
        task: _hash("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in task_samples))
        for task, task_samples in samples.items()
    }
    results.update(dataclasses.asdict(config))
    return results, samples


def _hash(text: str) -> str:
    from lm_eval.utils import hash_string

    return hash_string(text)


def extract_metrics(results: dict[str, Any], task: str) -> dict[str, float]:
    """The numeric metrics of ``task``, keyed by lm-eval metric name without the filter.

    ``{"acc,avg@8": 0.5, "pass@8,avg@8": 1.0, "acc_stderr,avg@8": 0.1}`` -> ``{"acc": 0.5, "pass@8": 1.0,
    "acc_stderr": 0.1}``; non-numeric entries (``"N/A"`` stderr, ``alias``) are left out.
    """
    entry = results["results"].get(task)
    if entry is None:
        raise EvalError(f"lm-eval returned no results for {task}; got {', '.join(results['results'])}")
    metrics = {}
    for key, value in entry.items():
        if "," in key and isinstance(value, int | float) and not isinstance(value, bool):
            metrics[key.split(",", 1)[0]] = float(value)
    if "acc" not in metrics:
        raise EvalError(f"lm-eval returned no acc for {task}: {entry}")
    return metrics


def effective_docs(results: dict[str, Any], task: str) -> int:
    """Problems evaluated for ``task``."""
    return int(results["n-samples"][task]["effective"])


def run_params(
    bench: Benchmark,
    settings: PairSettings,
    model_args: dict[str, Any],
    results: dict[str, Any],
    backend: str,
    source: str,
    prompt: str,
    limit: int | None,
) -> dict[str, Any]:
    """The MLflow params of an evaluation: what it ran, how it generated and scored, with which versions."""
    n_shot = results.get("n-shot", {})
    return {
        "benchmark": bench.name,
        "kind": bench.kind,
        "scoring": bench.scoring,
        "backend": backend,
        "model_args": model_args,
        "generation": bench.generation_kwargs(settings.max_gen_toks) or "none (loglikelihood)",
        "repeats": bench.k,
        "num_fewshot": max(n_shot.values()) if n_shot else 0,
        "seeds": {**SEEDS, "engine_seed": settings.seed},
        "lm_eval_version": importlib.metadata.version("lm_eval"),
        "transformers_version": importlib.metadata.version("transformers"),
        "apply_chat_template": True,
        "chat_template_sha": results.get("chat_template_sha"),
        "system_prompt": settings.system_prompt,
        "data_source": source,
        "prompt": prompt,
        "limit": limit,
        "n_docs": effective_docs(results, bench.name),
        "samples_per_problem": bench.k,
    }


def _sample_lines(samples: dict[str, list[dict[str, Any]]]) -> Iterator[str]:
    for task, task_samples in samples.items():
        for sample in task_samples:
            yield json.dumps({"task": task, **sample}, default=_jsonable, ensure_ascii=False) + "\n"


def _jsonable(value: Any) -> Any:
    from lm_eval.utils import handle_non_serializable

    return handle_non_serializable(value)
