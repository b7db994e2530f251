"""Which tracked runs a report reads (``commrl report --only``): the runs a pipeline's config declares.

Without a selection the report reads every run of a pair in the store, the newest per condition and seed.
A one-off run logged to the same store (``commrl train ... out_dir=results/runs/tiny/x/seed1``, another
rank) would then stand in for the pipeline's run of that condition and seed. With one, it reads only the
runs named by the files the pipeline wrote:
- a training run's ``summary.json`` (or its run folder): its ``mlflow_run_id``;
- an evaluation's summary ``.json`` (``commrl eval --out``): its ``mlflow_run_id``;
- a sweep's summary folder (the one holding ``best_params.json``): its ``study``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from commrl.report.runs import ReportInputError
from commrl.run.summary import SUMMARY_FILE, RunSummary, SummaryError

BEST_PARAMS = "best_params.json"


@dataclass(frozen=True)
class RunSelection:
    """MLflow run ids of training and evaluation runs, and of sweeps' parent runs (a study name where an
    older summary named no parent: every parent of that study then matches); ``sources`` maps each to the
    file that named it (for error messages)."""

    train: frozenset[str]
    evals: frozenset[str]
    studies: frozenset[str]
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def from_paths(cls, paths: Iterable[str | Path]) -> RunSelection:
        """The selection named by ``paths``; ``ReportInputError`` naming a path that is missing, of no
        known kind, or that names no MLflow run."""
        train, evals, studies, sources = set(), set(), set(), {}
        for path in map(Path, paths):
            kind, name = _named(path)
            {"train": train, "eval": evals, "sweep": studies}[kind].add(name)
            sources[name] = str(path)
        return cls(frozenset(train), frozenset(evals), frozenset(studies), sources)

    def check_found(self, train_ids: Iterable[str], eval_ids: Iterable[str], studies: Iterable[str]) -> None:
        """Every selected run was found in the store; else ``ReportInputError`` naming the file."""
        found = set(train_ids) | set(eval_ids) | set(studies)
        missing = sorted((self.train | self.evals | self.studies) - found)
        if missing:
            named = "; ".join(f"{self.sources[m]} names {m}" for m in missing)
            raise ReportInputError(
                f"--only: not in the MLflow store: {named}. Check --tracking-uri (the store those runs were "
                "logged to), or rerun the rules that wrote these files"
            )


def _named(path: Path) -> tuple[str, str]:
    """``(kind, run id or study)`` of one ``--only`` path."""
    if path.is_dir():
        if (path / BEST_PARAMS).is_file():  # its parent run (a summary written before it had one: the study)
            best = _json(path / BEST_PARAMS)
            return "sweep", best.get("mlflow_parent_run_id") or _field(path / BEST_PARAMS, best, "study")
        if (path / SUMMARY_FILE).is_file():
            return "train", _train_run_id(path / SUMMARY_FILE, _json(path / SUMMARY_FILE))
    elif path.is_file():
        values = _json(path)
        if "benchmark" in values:
            return "eval", _field(path, values, "mlflow_run_id")
        if "ticks_trained" in values:
            return "train", _train_run_id(path, values)
    elif not path.exists():
        raise ReportInputError(f"--only: {path} does not exist; run the rule that writes it, or leave it out")
    raise ReportInputError(
        f"--only: {path} is neither a training summary.json (or its run folder), an evaluation summary "
        f".json nor a sweep summary folder holding {BEST_PARAMS}"
    )


def _train_run_id(path: Path, values: dict) -> str:
    try:
        run_id = RunSummary.from_dict(values, str(path)).mlflow_run_id
    except SummaryError as err:
        raise ReportInputError(f"--only: {err}") from None
    if not run_id:
        raise ReportInputError(f"--only: {path} names no MLflow run (trained without tracking)")
    return run_id


def _json(path: Path) -> dict:
    try:
        values = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ReportInputError(f"--only: {path} is not readable JSON ({err})") from None
    if not isinstance(values, dict):
        raise ReportInputError(f"--only: {path} is not a JSON object")
    return values


def _field(path: Path, values: dict, key: str) -> str:
    value = values.get(key)
    if not isinstance(value, str) or not value:
        raise ReportInputError(f"--only: {path} has no {key} (logged without MLflow?); rerun its rule")
    return value
