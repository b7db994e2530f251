"""The errors of a bad evaluation request; each message names the value at fault and the fix.

A bad setting (backend, limit, a pair's evaluation settings, a benchmark's) is a
``commrl.errors.ConfigError``; the other classes here are what is wrong besides a setting.
"""

from __future__ import annotations

from commrl.data.schema import DataError


class EvalError(ValueError):
    """A bad evaluation request that is not a setting (checkpoint, training run's summary, missing vLLM)."""


class DatasetFormatError(EvalError):
    """A benchmark's rows lack a column or hold an unusable value."""


class TrainingRunError(EvalError):
    """The training run to nest under is missing from the store or belongs to another pair."""


class DatasetUnavailableError(RuntimeError):
    """A benchmark's dataset cannot be read (missing file, hub unreachable and not cached)."""


USER_ERRORS: tuple[type[Exception], ...] = (EvalError, DatasetUnavailableError, DataError)
