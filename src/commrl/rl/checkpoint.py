"""Checkpoints of a training run: ``<out_dir>/checkpoints/tick_<k>/state.pt``, written atomically.

A checkpoint holds everything the next tick depends on (model, optimizer, controller, RNG states,
health monitor, the metrics not yet sent to MLflow and the MLflow run id), so a rerun after a kill resumes
at the newest one with no duplicated and no missing ticks; and the run's config fingerprint
(``run_config``), which that rerun's config must match (``commrl.run.fingerprint``).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^tick_(\d{6})$")


class CheckpointStore:
    def __init__(self, root: str | Path, keep: int = 2):
        self.root = Path(root)
        self.keep = keep

    def ticks(self) -> list[int]:
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            m = _NAME.match(entry.name)
            if m and (entry / "state.pt").is_file():
                found.append(int(m.group(1)))
        return sorted(found)

    def save(self, tick: int, state: dict[str, Any]) -> Path:
        """Write ``state`` for ``tick`` (temp dir, fsync, rename) and keep the newest ``keep``; a temp dir a
        kill left (``.tmp_tick_*``, one writer per run) is deleted first."""
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(".tmp_tick_*"):
            shutil.rmtree(stale, ignore_errors=True)
        final = self.root / f"tick_{tick:06d}"
        tmp = Path(tempfile.mkdtemp(prefix=".tmp_tick_", dir=self.root))
        try:
            with open(tmp / "state.pt", "wb") as fh:
                torch.save(state, fh)
                fh.flush()
                os.fsync(fh.fileno())
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        for old in self.ticks()[: -self.keep]:
            shutil.rmtree(self.root / f"tick_{old:06d}", ignore_errors=True)
        return final

    def load_latest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest complete checkpoint as ``(tick, state)``, or None."""
        ticks = self.ticks()
        if not ticks:
            return None
        tick = ticks[-1]
        state = torch.load(
            self.root / f"tick_{tick:06d}" / "state.pt", map_location="cpu", weights_only=False
        )
        return tick, state
