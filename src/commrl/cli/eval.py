"""``commrl eval``: evaluate one checkpoint on one or more benchmarks with lm-eval and record each in MLflow.

``commrl eval --checkpoint results/runs/P/C/seedK/final --benchmark B --out results/eval/P/C/seedK/B.json
[--backend hf|vllm] [--summary results/runs/P/C/seedK/summary.json | --run-id ID] [--pair P] [--data PATH]``

``--benchmark B1 --benchmark B2 ... --out-dir results/eval/P/C/seedK`` evaluates them in turn with one model
(one import and engine build), writing ``<out-dir>/<B>.json`` for each; ``--data B=PATH`` is one
benchmark's problems, ``--data PATH`` every benchmark's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from commrl.cli.main import fail
from commrl.errors import ConfigError
from commrl.eval.benchmarks import BENCHMARKS
from commrl.eval.errors import EvalError
from commrl.eval.runner import BACKENDS
from commrl.run.summary import RunSummary, SummaryError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--checkpoint",
        default=None,
        help="HF model directory; default: the read point recorded in --summary (the pair's read tick)",
    )
    add(
        "--benchmark",
        required=True,
        action="append",
        choices=list(BENCHMARKS),
        metavar="NAME",
        help="repeat for several, evaluated with one model: " + ", ".join(BENCHMARKS),
    )
    add("--backend", choices=BACKENDS, default="hf", help="lm-eval model backend (default hf)")
    outputs = parser.add_mutually_exclusive_group()
    outputs.add_argument(
        "--out", default=None, help="one benchmark's summary JSON, written last; results, samples beside it"
    )
    outputs.add_argument("--out-dir", default=None, help="<out-dir>/<benchmark>.json for each benchmark")
    parent = parser.add_mutually_exclusive_group()
    parent.add_argument("--run-id", default=None, help="MLflow id of the training run to nest under")
    parent.add_argument("--summary", default=None, help="a training run's summary.json (its mlflow_run_id)")
    add("--pair", default=None, help="settings of this pair (default: the run's pair tag; toy ones: tiny)")
    add("--limit", type=int, default=None, help="evaluate the first N problems only")
    add("--max-gen-toks", type=int, default=None, help="response budget (default: the pair's)")
    add(
        "--data",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="problems file (jsonl, json, parquet: problem, answer) of benchmark NAME, or of all of them; "
        "default: hub",
    )
    add("--prompt-template", default=None, help="user message with {problem} (default: the data's prompt)")
    add("--system-prompt", default=None, help="system message (default: the pair's: none)")
    add("--config", default=None, help="YAML of eval settings (max_gen_toks, max_model_len, dtype, ...)")
    add("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or results/mlflow.db")


def read_summary(summary: str | Path) -> RunSummary:
    """A training run's ``summary.json`` (both drivers write the same schema)."""
    try:
        return RunSummary.read(Path(summary))
    except SummaryError as err:
        raise EvalError(f"--summary: {err}; or pass --checkpoint and --run-id") from None


def read_point_checkpoint(trained: RunSummary, source: str | Path) -> str:
    """The HF directory of the run at its read tick (``read``)."""
    if not trained.read:
        raise EvalError(
            f"--summary {source} records no model at the read tick {trained.read_at} (trained "
            f"{trained.ticks_trained} of {trained.ticks_asked} ticks); finish the run or pass --checkpoint"
        )
    return trained.read


def benchmark_paths(
    benchmarks: list[str], out: str | None, out_dir: str | None, data: list[str]
) -> tuple[dict[str, Path], dict[str, str]]:
    """Each benchmark's ``out`` and ``data`` from ``--out``/``--out-dir`` and ``--data [NAME=]PATH``."""
    if len(set(benchmarks)) < len(benchmarks):
        raise ConfigError(f"--benchmark: {', '.join(benchmarks)} names a benchmark twice")
    if out is not None and len(benchmarks) > 1:
        raise ConfigError("--out names one benchmark's file; give --out-dir DIR for several benchmarks")
    outs = {benchmarks[0]: Path(out)} if out else {}
    if out_dir:
        outs = {name: Path(out_dir) / f"{name}.json" for name in benchmarks}
    paths: dict[str, str] = {}
    for item in data:
        name, sep, path = item.partition("=")
        if not sep:
            if len(data) > 1:
                raise ConfigError(f"--data {item}: with several --data, write each as NAME=PATH")
            paths = {benchmark: item for benchmark in benchmarks}
            continue
        if name not in benchmarks:
            raise ConfigError(f"--data {item}: {name!r} is not one of the --benchmark names {benchmarks}")
        paths[name] = path
    return outs, paths


def run(args: argparse.Namespace) -> int:
    from commrl.eval import USER_ERRORS, evaluate_benchmarks

    try:
        outs, data = benchmark_paths(args.benchmark, args.out, args.out_dir, args.data)
        trained = read_summary(args.summary) if args.summary else None
        run_id = args.run_id or (trained.mlflow_run_id if trained else None)
        if args.summary and run_id is None:
            print(
                f"commrl eval: {args.summary} records no MLflow run; the evaluation run is not nested",
                file=sys.stderr,
            )
        if args.checkpoint is None and args.summary is None:
            raise ConfigError(
                "give --checkpoint DIR, or --summary of a training run to evaluate its read point"
            )
        checkpoint = args.checkpoint or read_point_checkpoint(trained, args.summary)
        summaries = evaluate_benchmarks(
            checkpoint,
            args.benchmark,
            backend=args.backend,
            outs=outs,
            data=data,
            pair=args.pair or (trained.pair if trained else None),
            run_id=run_id,
            limit=args.limit,
            max_gen_toks=args.max_gen_toks,
            prompt_template=args.prompt_template,
            config=args.config,
            settings_overrides={"system_prompt": args.system_prompt},
            tracking_uri=args.tracking_uri,
        )
    except USER_ERRORS as err:
        return fail("eval", err)
    for summary in summaries:
        metrics = summary["metrics"]
        metrics = ", ".join(f"{k}={v:.4f}" for k, v in metrics.items() if not k.endswith("_stderr"))
        out = outs.get(summary["benchmark"])
        print(
            f"{summary['benchmark']} on {summary['checkpoint']}: {metrics} ({summary['n_docs']} problems)"
            + (f" -> {out}" if out else "")
        )
    return 0
