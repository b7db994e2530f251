"""lm-eval task YAMLs generated from the benchmark registry into an include directory.

A task directory holds ``<task>.yaml``, the task's docs as ``<task>.jsonl`` (read with lm-eval's ``json``
loader, offline) and ``commrl_scoring.py``, the module its ``!function`` entries name (lm-eval resolves
``!function module.fn`` to a file beside the YAML). The directory is self-contained: ``lm_eval
--include_path DIR --tasks <task>`` reruns it with commrl installed.

Greedy tasks keep lm-eval's ``take_first`` filter; avg@k tasks use ``take_first_k`` with k = repeats,
without which lm-eval would score only the first of the k samples.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from commrl.eval.atomic import write_text_atomic
from commrl.eval.benchmarks import AVG_K, GREEDY, MC, Benchmark
from commrl.eval.problems import MC_LETTERS

SCORING_MODULE = "commrl_scoring"
SCORING_SOURCE = (
    '"""Scoring functions named by the commrl task YAMLs in this directory."""\n\n'
    "from commrl.eval.scoring import process_avg_k, process_greedy, process_greedy_letter  # noqa: F401\n"
)


class FunctionRef(str):
    """A YAML ``!function module.name`` entry."""


class _TaskDumper(yaml.SafeDumper):
    pass


_TaskDumper.add_representer(FunctionRef, lambda dumper, ref: dumper.represent_scalar("!function", str(ref)))


def task_config(benchmark: Benchmark, data_file: Path, max_gen_toks: int) -> dict[str, Any]:
    """The lm-eval task config of a generated benchmark reading its docs from ``data_file``."""
    config: dict[str, Any] = {
        "task": benchmark.name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test",
        "num_fewshot": 0,
        "doc_to_text": "prompt",
    }
    metric = {"aggregation": "mean", "higher_is_better": True}
    if benchmark.kind == MC:
        config |= {
            "output_type": "multiple_choice",
            "doc_to_choice": list(MC_LETTERS),
            "doc_to_target": "gold",
            "metric_list": [{"metric": "acc", **metric}],
        }
    else:
        kind_config = {
            GREEDY: {
                "process_results": FunctionRef(
                    f"{SCORING_MODULE}.{'process_greedy_letter' if benchmark.letter else 'process_greedy'}"
                ),
                "filter_list": [{"name": "greedy", "filter": [{"function": "take_first"}]}],
            },
            AVG_K: {
                "process_results": FunctionRef(f"{SCORING_MODULE}.process_avg_k"),
                "filter_list": [
                    {"name": f"avg@{benchmark.k}", "filter": [{"function": "take_first_k", "k": benchmark.k}]}
                ],
            },
        }[benchmark.kind]
        config |= {
            "output_type": "generate_until",
            "doc_to_target": "answer",
            "generation_kwargs": benchmark.generation_kwargs(max_gen_toks),
            "repeats": benchmark.k,
            **kind_config,
            "metric_list": [{"metric": name, **metric} for name in benchmark.metrics],
        }
    config["metadata"] = {"version": 1.0}
    return config


def task_yaml(config: dict[str, Any]) -> str:
    """``config`` as YAML text, with ``FunctionRef`` values as ``!function`` tags."""
    return yaml.dump(config, Dumper=_TaskDumper, sort_keys=False, allow_unicode=True, width=1000)


def write_task_dir(
    benchmark: Benchmark, docs: Sequence[dict[str, Any]], max_gen_toks: int, task_dir: str | Path
) -> Path:
    """Write the docs, the scoring module and the task YAML of ``benchmark`` into ``task_dir``.

    Returns the YAML's path.
    """
    task_dir = Path(task_dir).resolve()
    task_dir.mkdir(parents=True, exist_ok=True)
    data_file = task_dir / f"{benchmark.name}.jsonl"
    write_text_atomic(data_file, "".join(json.dumps(doc, ensure_ascii=False) + "\n" for doc in docs))
    write_text_atomic(task_dir / f"{SCORING_MODULE}.py", SCORING_SOURCE)
    yaml_path = task_dir / f"{benchmark.name}.yaml"
    write_text_atomic(yaml_path, task_yaml(task_config(benchmark, data_file, max_gen_toks)))
    return yaml_path
