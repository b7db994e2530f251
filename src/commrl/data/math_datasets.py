"""The real datasets (MATH train, MATH500, DeepScaleR): raw rows -> verl rows, rejects counted by reason.

Ground truth is the ``answer`` column when the layout has one and the value is non-empty, else the last
``\\boxed{...}`` of ``solution`` (``commrl.data.boxed.last_boxed``). A row without a usable problem or
answer is rejected and counted under its reason, never dropped silently. MATH train and DeepScaleR have
every MATH500 problem removed by normalised problem-text match (``normalize_problem``), counted in the
manifest (``rows_removed_overlap``): pair B trains on DeepScaleR and validates and is read on MATH500.
Numbers reach the text as written (``as_text``); an integer that a binary float of the source may have
rounded is an error naming the row.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from commrl.data.boxed import last_boxed
from commrl.data.files import PreparedDataset
from commrl.data.schema import QWEN_MATH_TEMPLATE, DataError, validate_template, verl_row
from commrl.data.sources import JsonNumber, is_local, load_rows

MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)
MATH500_HUB_ID = "HuggingFaceH4/MATH-500"
EXACT_FLOAT_INTEGERS = 2**53  # a binary float holds every integer below this exactly, not all above
_ZERO_FRACTION = re.compile(r"(-?\d+)\.0+")


@dataclass(frozen=True)
class RealDatasetSpec:
    """Where a dataset lives on the hub, its column layouts and the split it is written as."""

    name: str
    data_source: str
    default_source: str
    source_split: str
    out_split: str
    held_out: bool
    layouts: tuple[str, ...]
    hub_configs: tuple[tuple[str, tuple[str | None, ...]], ...] = ()
    default_exclude: str | None = None

    def configs_for(self, hub_id: str) -> tuple[str | None, ...]:
        """The hub configs to concatenate for ``hub_id`` (the default config for an unknown id)."""
        return dict(self.hub_configs).get(hub_id, (None,))


SPECS: dict[str, RealDatasetSpec] = {
    "math": RealDatasetSpec(
        name="math",
        data_source="commrl/math",
        default_source="EleutherAI/hendrycks_math",
        source_split="train",
        out_split="train",
        held_out=False,
        layouts=(
            "EleutherAI/hendrycks_math (one config per subject): problem, level, type, solution",
            "DigitalLearningGmbH/MATH-lighteval (config default): problem, level, type, solution",
        ),
        hub_configs=(
            ("EleutherAI/hendrycks_math", MATH_SUBJECTS),
            ("DigitalLearningGmbH/MATH-lighteval", ("default",)),
        ),
        default_exclude=MATH500_HUB_ID,
    ),
    "math500": RealDatasetSpec(
        name="math500",
        data_source="commrl/math500",
        default_source=MATH500_HUB_ID,
        source_split="test",
        out_split="test",
        held_out=True,
        layouts=("HuggingFaceH4/MATH-500: problem, solution, answer, subject, level, unique_id",),
    ),
    "deepscaler": RealDatasetSpec(
        name="deepscaler",
        data_source="commrl/deepscaler",
        default_source="agentica-org/DeepScaleR-Preview-Dataset",
        source_split="train",
        out_split="train",
        held_out=False,
        layouts=("agentica-org/DeepScaleR-Preview-Dataset: problem, answer, solution",),
        default_exclude=MATH500_HUB_ID,
    ),
}
EXTRA_COLUMNS = {"level": "level", "type": "subject", "subject": "subject", "unique_id": "unique_id"}


def normalize_problem(text: str) -> str:
    """Problem text for overlap matching: Unicode NFKC, case-folded, all whitespace removed."""
    return re.sub(r"\s+", "", unicodedata.normalize("NFKC", text)).casefold()


class InexactNumberError(ValueError):
    """A cell is a binary float too large to tell which integer the source meant."""


class NotTextError(ValueError):
    """A cell that is no text, number or list of them (a mapping, a boolean): the row is rejected, counted
    as ``<column>_not_text``."""

    def __init__(self, column: str, value: Any) -> None:
        super().__init__(f"column {column!r} holds a {type(value).__name__}, not text")
        self.reason = f"{column}_not_text"


def as_text(value: Any) -> str:
    """A cell as stripped text: '' for None/NaN; a JSON number as written, integral ones without ``.0``; a
    list (OlympiadBench's ``final_answer``) its elements' texts joined with ``, ``, as evaluation joins them
    (``commrl.eval.problems.answer_text``).

    A float (a parquet or hub column) is written in its shortest exact form; an integral one at or above
    ``EXACT_FLOAT_INTEGERS`` raises ``InexactNumberError``, since the integer it stood for may be lost. A
    mapping or a boolean raises ``TypeError`` (``row_text``: rejected and counted).
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool | np.bool_ | dict):
        raise TypeError(f"a {type(value).__name__} is no text")
    if isinstance(value, list | tuple | np.ndarray):
        return ", ".join(text for text in (as_text(v) for v in value) if text)
    if isinstance(value, JsonNumber):
        match = _ZERO_FRACTION.fullmatch(value)
        return match[1] if match else str(value)
    if isinstance(value, float) and value.is_integer():
        if abs(value) >= EXACT_FLOAT_INTEGERS:
            raise InexactNumberError(f"the binary float {value!r} may not be the integer in the source")
        return str(int(value))
    return str(value).strip()


def row_text(raw: dict[str, Any], column: str, row: int, source: str) -> str:
    """``as_text`` of ``raw[column]``; an inexact number is a ``DataError`` naming the column and row, a
    cell that is no text a ``NotTextError`` (the row is rejected under its reason)."""
    try:
        return as_text(raw.get(column))
    except TypeError:
        raise NotTextError(column, raw.get(column)) from None
    except InexactNumberError as err:
        raise DataError(
            f"{source!r}, row {row} (0-based), column {column!r}: {err} (floats hold integers exactly only "
            f"below 2**53). Store the {column!r} column as text, e.g. as JSON strings or a string column "
            "in parquet, or as JSON numbers in a .json/.jsonl file (read exactly)"
        ) from err


def ground_truth(answer: str, solution: str) -> tuple[str | None, str | None]:
    """``(ground_truth, None)``, or ``(None, reject_reason)`` when there is no usable answer."""
    if answer:
        return answer, None
    if not solution:
        return None, "no_answer"
    boxed = last_boxed(solution)
    if boxed is None:
        return None, "no_boxed_answer_in_solution"
    if not boxed.strip():
        return None, "empty_boxed_answer"
    return boxed.strip(), None


def check_columns(frame: pd.DataFrame, spec: RealDatasetSpec, source: str) -> None:
    """Require ``problem`` and one of ``answer``/``solution``; the error names the expected layouts."""
    cols = list(frame.columns)
    missing = [] if "problem" in cols else ["problem"]
    if "answer" not in cols and "solution" not in cols:
        missing.append("answer (or solution)")
    if missing:
        layouts = "; ".join(spec.layouts)
        raise DataError(
            f"{spec.name} source {source!r} has no column {' and no column '.join(map(repr, missing))} "
            f"(it has {cols}); expected the layout {layouts}. Rename the columns or pass the right --source"
        )


def load_exclusion(source: str) -> set[str]:
    """Normalised problem texts of the MATH500 set at ``source``: a hub id, a raw file or folder (column
    ``problem``), or ``commrl prepare``'s own output (``extra_info.problem`` of the verl parquet)."""
    spec = SPECS["math500"]
    frame = load_rows(source, split=spec.source_split, hub_configs=spec.configs_for(source), flag="--exclude")
    texts = list(frame["problem"]) if "problem" in frame.columns else []
    if "extra_info" in frame.columns:
        texts += [info.get("problem") for info in frame["extra_info"] if isinstance(info, dict)]
    problems = {normalize_problem(as_text(p)) for p in texts if as_text(p)}
    if not problems:
        raise DataError(
            f"--exclude source {source!r} has no problem texts (columns {list(frame.columns)}); expected the "
            f"layout {spec.layouts[0]} or a verl parquet written by `commrl prepare --dataset math500`"
        )
    return problems


def prepare_real(
    name: str, *, source: str | None = None, exclude: str | None = None, template: str = QWEN_MATH_TEMPLATE
) -> PreparedDataset:
    """Load ``name`` (``math``, ``math500``, ``deepscaler``) from ``source`` and build its verl rows.

    ``exclude`` (default: MATH500 for ``math`` and ``deepscaler``) is a MATH500 source whose problems are
    removed.
    """
    if name not in SPECS:
        raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(SPECS)} (or toy)")
    spec = SPECS[name]
    validate_template(template)
    source = source or spec.default_source
    exclude = exclude or spec.default_exclude
    configs = spec.configs_for(source)
    frame = load_rows(source, split=spec.source_split, hub_configs=configs)
    check_columns(frame, spec, source)
    excluded = load_exclusion(exclude) if exclude else set()

    rejected: Counter[str] = Counter()
    overlap = 0
    rows: list[dict[str, Any]] = []
    extra_cols = {col: key for col, key in EXTRA_COLUMNS.items() if col in frame.columns}
    for source_index, raw in enumerate(frame.to_dict("records")):
        try:
            problem = row_text(raw, "problem", source_index, source)
            if not problem:
                rejected["empty_problem"] += 1
                continue
            answer, solution = (row_text(raw, col, source_index, source) for col in ("answer", "solution"))
        except NotTextError as err:
            rejected[err.reason] += 1
            continue
        truth, reason = ground_truth(answer, solution)
        if truth is None:
            rejected[reason or "no_answer"] += 1
            continue
        if normalize_problem(problem) in excluded:
            overlap += 1
            continue
        extra = {key: row_text(raw, col, source_index, source) for col, key in extra_cols.items()}
        rows.append(
            verl_row(
                data_source=spec.data_source,
                problem=problem,
                ground_truth=truth,
                split=spec.out_split,
                index=len(rows),
                template=template,
                extra={"source_index": source_index, **extra},
            )
        )
    manifest = {
        "dataset": name,
        "data_source": spec.data_source,
        "source": str(Path(source).resolve()) if is_local(source) else source,
        "source_kind": "local" if is_local(source) else "hub",
        "source_split": spec.source_split,
        "hub_configs": None if is_local(source) else list(configs),
        "prompt_template": template,
        "rows_in": len(frame),
        "rows_out": len(rows),
        "rows_rejected": dict(sorted(rejected.items())),
        "rows_removed_overlap": overlap,
        "exclude": None
        if not exclude
        else {
            "source": str(Path(exclude).resolve()) if is_local(exclude) else exclude,
            "problems": len(excluded),
            "match": "normalize_problem: NFKC, case-folded, whitespace removed",
        },
    }
    held_out = (spec.out_split,) if spec.held_out else ()
    return PreparedDataset(splits={spec.out_split: rows}, held_out=held_out, manifest=manifest)
