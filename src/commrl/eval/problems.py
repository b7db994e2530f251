"""The problems of a benchmark: read from a local file or the hub, normalised, rendered as lm-eval docs.

Sources differ in column names, so rows are normalised to ``problem`` and ``answer`` (the first present
of ``problem/Problem/question/Question`` and ``answer/Answer/final_answer/expected_answer``; a list answer,
as OlympiadBench's ``final_answer``, is joined; ``$...$`` around an answer is dropped). A row with
``choices`` (MMLU: the options, ``answer`` the right one's index) becomes its question followed by
``Answer Choices: (A) ... (B) ...``, as Qwen2.5-Math's evaluation writes it, and the answer its letter.
A benchmark with ``subjects`` keeps the rows of those subjects (the ``subject`` column). The user message
is the data's own ``prompt`` column when it has one (``commrl prepare`` writes it with the template the
policy was trained on), else the benchmark's prompt template applied to the problem.

Everything is read before lm-eval starts: offline, lm-eval aborts a whole run on one missing dataset
after the model has loaded, so a missing dataset is reported here, naming it and how to supply it.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from commrl.data.schema import format_prompt
from commrl.eval.benchmarks import MC, Benchmark, HubSource
from commrl.eval.errors import DatasetFormatError, DatasetUnavailableError

PROBLEM_COLUMNS = ("problem", "Problem", "question", "Question")
ANSWER_COLUMNS = ("answer", "Answer", "final_answer", "expected_answer")
MC_LETTERS = ("A", "B", "C", "D")
CHOICE_LETTERS = "ABCDE"  # the option letters a multiple-choice row may have (Qwen2.5-Math reads A-E)
MC_OFFSETS = (-10, -2, -1, 1, 2, 10)


def load_rows(benchmark: Benchmark, data: str | Path | None = None) -> tuple[list[dict[str, Any]], str]:
    """The raw rows of ``benchmark`` and a description of where they came from.

    ``data`` (a jsonl, json or parquet file) wins over the benchmark's hub source.
    """
    if data is not None:
        path = Path(data).resolve()
        rows, source = read_local(path, benchmark.name), str(path)
    elif benchmark.hub is None:
        raise DatasetUnavailableError(
            f"benchmark {benchmark.name} reads a local file and none was given: pass --data PATH, a jsonl "
            "with problem/answer columns (for the toy suite: DIR/test.jsonl written by "
            "`commrl prepare --dataset toy --out DIR`)"
        )
    else:
        rows, source = load_hub(benchmark.hub, benchmark.name), benchmark.hub.describe()
    return of_subjects(rows, benchmark.subjects, source), source


def of_subjects(rows: Sequence[dict[str, Any]], subjects: Sequence[str], source: str) -> list[dict[str, Any]]:
    """The rows whose ``subject`` is one of ``subjects`` (all rows when ``subjects`` is empty)."""
    if not subjects:
        return list(rows)
    if rows and "subject" not in rows[0]:
        found, wanted = ", ".join(sorted(rows[0])), ", ".join(subjects)
        raise DatasetFormatError(f"{source}: no subject column to select {wanted} by; found {found}")
    kept = [row for row in rows if row.get("subject") in subjects]
    if not kept:
        raise DatasetFormatError(f"{source}: no row of the subjects {', '.join(subjects)}")
    return kept


def read_local(path: Path, benchmark: str) -> list[dict[str, Any]]:
    """Rows of a local ``.jsonl``, ``.json`` (a list of objects) or ``.parquet`` file."""
    if not path.is_file():
        raise DatasetUnavailableError(
            f"benchmark {benchmark}: data file {path} does not exist; write it with `commrl prepare` "
            "(held-out splits are written as <split>.jsonl) or fix --data"
        )
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise DatasetFormatError(f"{path}: a .json data file must hold a list of objects")
        return rows
    if path.suffix != ".jsonl":
        raise DatasetFormatError(f"{path}: unsupported type {path.suffix!r}; use .jsonl, .json or .parquet")
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise DatasetFormatError(f"{path}:{number}: not a JSON object ({err.msg})") from err
    return rows


def load_hub(source: HubSource, benchmark: str) -> list[dict[str, Any]]:
    """Rows of a hub dataset through ``datasets.load_dataset`` (the local cache when offline)."""
    import datasets

    try:
        ds = datasets.load_dataset(source.path, source.name, split=source.split)
    except Exception as err:  # offline, not cached, renamed: all end the same way
        raise DatasetUnavailableError(hub_help(source, benchmark, err)) from err
    return ds.to_list()


def hub_help(source: HubSource, benchmark: str, err: Exception) -> str:
    name = "" if source.name is None else f", {source.name!r}"
    return (
        f"benchmark {benchmark}: cannot load {source.describe()} ({type(err).__name__}: {err}). Supply it "
        "either as a local jsonl with problem/answer columns, passed as --data PATH (or set in the pipeline "
        f'config), or pre-cache it on a networked node with the same HF_HOME: python -c "import datasets; '
        f'datasets.load_dataset({source.path!r}{name}, split={source.split!r})" and run offline with '
        "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1"
    )


def answer_text(value: Any) -> str:
    """An answer as a string: lists joined with ``, ``, integral floats without ``.0``, ``$..$`` dropped."""
    if isinstance(value, list | tuple):
        return ", ".join(answer_text(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return text


def _missing(value: Any) -> bool:
    """No answer: None, a NaN (a float column's empty cell), or a list with a missing element."""
    if isinstance(value, list | tuple):
        return not value or any(_missing(v) for v in value)
    return value is None or (isinstance(value, float) and math.isnan(value))


def normalise(rows: Sequence[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """``{"problem", "answer"}`` (+ ``prompt`` when the source has it) per row, in order."""
    if not rows:
        raise DatasetFormatError(f"{source}: no rows")
    columns = set(rows[0])
    problem_col = next((c for c in PROBLEM_COLUMNS if c in columns), None)
    answer_col = next((c for c in ANSWER_COLUMNS if c in columns), None)
    if problem_col is None or answer_col is None:
        missing = "problem" if problem_col is None else "answer"
        accepted = PROBLEM_COLUMNS if problem_col is None else ANSWER_COLUMNS
        raise DatasetFormatError(
            f"{source}: no {missing} column; found {', '.join(sorted(columns))}; "
            f"accepted: {', '.join(accepted)}"
        )
    out = []
    for index, row in enumerate(rows):
        problem, answer = row.get(problem_col), row.get(answer_col)
        if not isinstance(problem, str) or not problem.strip():
            raise DatasetFormatError(f"{source}: row {index} has an empty {problem_col!r}")
        if "choices" in columns:
            problem, answer = with_choices(problem, row.get("choices"), answer, f"{source}: row {index}")
        text = "" if _missing(answer) else answer_text(answer)
        if not text:
            raise DatasetFormatError(f"{source}: row {index} has an empty {answer_col!r}")
        doc = {"problem": problem, "answer": text}
        if isinstance(row.get("prompt"), str):
            doc["prompt"] = row["prompt"]
        out.append(doc)
    return out


def with_choices(question: str, choices: Any, answer: Any, where: str) -> tuple[str, str]:
    """``(problem, letter)`` of a multiple-choice row: the question and its options as Qwen2.5-Math's
    evaluation writes MMLU-STEM (``{question}\nAnswer Choices: (A) x (B) y ...``) and the right option's
    letter (``answer``: its index, or already a letter)."""
    if not isinstance(choices, list | tuple) or not 2 <= len(choices) <= len(CHOICE_LETTERS):
        raise DatasetFormatError(
            f"{where}: choices must be a list of 2 to {len(CHOICE_LETTERS)} options, got {choices!r}"
        )
    letters = CHOICE_LETTERS[: len(choices)]
    if isinstance(answer, str) and answer.strip() in letters:
        letter = answer.strip()
    elif isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        letter = letters[answer]
    else:
        raise DatasetFormatError(
            f"{where}: answer must be the right option's index (0 to {len(choices) - 1}) or letter "
            f"({', '.join(letters)}), got {answer!r}"
        )
    labelled = zip(letters, choices, strict=True)
    options = " ".join(f"({label}) {str(option).strip()}" for label, option in labelled)
    return f"{question.strip()}\nAnswer Choices: {options}", letter


def build_docs(
    benchmark: Benchmark, rows: Sequence[dict[str, Any]], source: str, prompt_template: str | None = None
) -> list[dict[str, Any]]:
    """The lm-eval docs of ``benchmark``: normalised rows with the user message in ``prompt``.

    ``prompt_template`` (with ``{problem}``) overrides the data's ``prompt`` column and the benchmark's
    template; multiple-choice docs get ``choices`` and ``gold`` (see ``multiple_choice_doc``).
    """
    docs = normalise(rows, source)
    if benchmark.kind == MC:
        return [multiple_choice_doc(d["problem"], d["answer"], i, source) for i, d in enumerate(docs)]
    for doc in docs:
        if prompt_template is not None or "prompt" not in doc:
            doc["prompt"] = format_prompt(prompt_template or benchmark.prompt_template, doc["problem"])
    return docs


def multiple_choice_doc(problem: str, answer: str, index: int, source: str = "data") -> dict[str, Any]:
    """A four-option question on an integer answer, in MMLU's layout (``...\\nA. x\\n...\\nAnswer:``).

    The options are the answer and three distractors ``answer + d`` with ``d`` drawn from
    ``MC_OFFSETS``, shuffled; both draws are seeded by ``index``, so the question is reproducible.
    """
    try:
        value = int(answer)
    except ValueError:
        raise DatasetFormatError(
            f"{source}: row {index}: multiple choice needs an integer answer, got {answer!r}"
        ) from None
    rng = random.Random(index)
    options = [value, *(value + d for d in rng.sample(MC_OFFSETS, len(MC_LETTERS) - 1))]
    rng.shuffle(options)
    lines = "".join(f"\n{letter}. {option}" for letter, option in zip(MC_LETTERS, options, strict=True))
    return {
        "problem": problem,
        "answer": answer,
        "prompt": f"{problem}{lines}\nAnswer:",
        "choices": [str(o) for o in options],
        "gold": options.index(value),
    }
