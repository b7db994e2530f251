"""``DIR/summary.json``: what one training run did, in one schema for both drivers, with one reader.

Written last by the driver (local trainer or ``commrl verl-train``); read by eval (which model is the read
point), the sweep (val/acc per validation, ticks trained) and the workflow (the rule's output). Keys:

==================  ==========================================================================
``pair``            the model/dataset pair; ``condition``, ``seed``, ``driver`` likewise
``ticks_asked``     the ticks the run was asked for; ``ticks_trained`` what it reached
``complete``        ``ticks_trained >= ticks_asked``
``stopped_early``   why a callback stopped it (a pruner, a collapse alarm), else null
``mlflow_run_id``   the MLflow run (null when tracking was off)
``final``           HF folder of the last tick trained (``DIR/final``)
``read_at``         the tick the run is read at; ``read`` its HF folder (``DIR/tick<read_at>`` when it
                    came before the last tick, else ``final``; null if the run never reached it)
``val_acc``         ``{tick: accuracy}`` of every validation
``time_s``          this attempt's wall seconds per phase (set-up, sampling, training, validation,
                    checkpoints, tracking; ``commrl.rl.timing``), where the driver measures them
==================  ==========================================================================
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SUMMARY_FILE = "summary.json"
FINAL_DIR = "final"


class SummaryError(ValueError):
    """A ``summary.json`` that is missing or malformed; the message names the file and the fix."""


def read_point_dir_name(read_at: int) -> str:
    """The folder of the model at an earlier read tick: ``tick<read_at>``."""
    return f"tick{read_at}"


def read_point(out_dir: Path, read_at: int, ticks_trained: int, final: str | None) -> str | None:
    """The model at the read tick: ``final`` when the read tick is the last one trained, the exported
    ``DIR/tick<read_at>`` when it came earlier, else None (the run did not reach it, or never exported it)."""
    if read_at == ticks_trained:
        return final
    exported = Path(out_dir) / read_point_dir_name(read_at)
    return str(exported) if read_at < ticks_trained and exported.is_dir() else None


@dataclass(frozen=True)
class RunSummary:
    """One run's ``summary.json``."""

    pair: str
    condition: str
    seed: int
    driver: str
    ticks_asked: int
    ticks_trained: int
    mlflow_run_id: str | None
    final: str | None
    read_at: int
    read: str | None
    val_acc: dict[int, float] = field(default_factory=dict)
    stopped_early: str | None = None
    time_s: dict[str, float] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.ticks_trained >= self.ticks_asked

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["val_acc"] = {str(k): v for k, v in sorted(self.val_acc.items())}
        values["complete"] = self.complete
        return values

    def write(self, out_dir: Path) -> Path:
        """``DIR/summary.json`` through a temporary file and a rename (never half-written)."""
        path = Path(out_dir) / SUMMARY_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
        return path

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "summary") -> RunSummary:
        missing = [
            name
            for name in ("pair", "condition", "seed", "driver", "ticks_asked", "ticks_trained", "read_at")
            if name not in values
        ]
        if missing:
            raise SummaryError(
                f"{source} lacks {', '.join(missing)}: it was not written by this version of commrl; "
                "rerun the training rule (its checkpoints are reused)"
            )
        try:
            return cls(
                pair=str(values["pair"]),
                condition=str(values["condition"]),
                seed=int(values["seed"]),
                driver=str(values["driver"]),
                ticks_asked=int(values["ticks_asked"]),
                ticks_trained=int(values["ticks_trained"]),
                mlflow_run_id=values.get("mlflow_run_id"),
                final=values.get("final"),
                read_at=int(values["read_at"]),
                read=values.get("read"),
                val_acc={int(k): float(v) for k, v in (values.get("val_acc") or {}).items()},
                stopped_early=values.get("stopped_early"),
                time_s={str(k): float(v) for k, v in (values.get("time_s") or {}).items()},
            )
        except (TypeError, ValueError) as err:
            raise SummaryError(f"{source} has a malformed value ({err}); rerun the training rule") from None

    @classmethod
    def read(cls, path: Path) -> RunSummary:
        """The summary at ``path`` (a ``summary.json`` or the run folder holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / SUMMARY_FILE
        if not path.is_file():
            raise SummaryError(f"{path} does not exist; train the run first (its rule writes it last)")
        try:
            values = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise SummaryError(f"{path} is not JSON ({err.msg}); rerun the training rule") from None
        if not isinstance(values, dict):
            raise SummaryError(f"{path} is not a JSON object; rerun the training rule")
        return cls.from_dict(values, str(path))
