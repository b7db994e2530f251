"""The errors of a bad evaluation request; each message names the value at fault and the fix."""

from __future__ import annotations

from commrl.data.schema import DataError


class EvalError(ValueError):
    """A bad evaluation request (backend, checkpoint, limit, pair, missing vLLM)."""


class BenchmarkError(EvalError):
    """An unknown benchmark or a bad benchmark setting."""


class PairConfigError(EvalError):
    """A missing or out-of-range evaluation setting of a pair."""


class DatasetFormatError(EvalError):
    """A benchmark's rows lack a column or hold an unusable value."""


class TrainingRunError(EvalError):
    """The training run to nest under is missing from the store or belongs to another pair."""


class DatasetUnavailableError(RuntimeError):
    """A benchmark's dataset cannot be read (missing file, hub unreachable and not cached)."""


USER_ERRORS: tuple[type[Exception], ...] = (EvalError, DatasetUnavailableError, DataError)
