"""Evaluation with lm-eval: the benchmark registry, generated task YAMLs, the runner and MLflow logging.

``evaluate_benchmarks(checkpoint, benchmarks, backend="hf", outs=None, data=None, ...)`` is what
``commrl eval`` calls (``evaluate_checkpoint`` per benchmark, with one model for all of them).
"""

from commrl.eval.benchmarks import BENCHMARKS, Benchmark, HubSource, get_benchmark
from commrl.eval.errors import (
    USER_ERRORS,
    DatasetFormatError,
    DatasetUnavailableError,
    EvalError,
    TrainingRunError,
)
from commrl.eval.pairs import EVAL_DEFAULTS, PairSettings, pair_settings
from commrl.eval.runner import BACKENDS, evaluate_benchmarks, evaluate_checkpoint

__all__ = [
    "BACKENDS",
    "BENCHMARKS",
    "EVAL_DEFAULTS",
    "USER_ERRORS",
    "Benchmark",
    "DatasetFormatError",
    "DatasetUnavailableError",
    "EvalError",
    "HubSource",
    "PairSettings",
    "TrainingRunError",
    "evaluate_benchmarks",
    "evaluate_checkpoint",
    "get_benchmark",
    "pair_settings",
]
