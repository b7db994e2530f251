"""After a cluster run: how many ticks verl trained, the HF folders of its checkpoints, ``summary.json``.

verl's trainer saves ``<checkpoints>/global_step_<k>/actor/`` (sharded FSDP state + ``huggingface/`` with
the config and tokenizer) every ``trainer.save_freq`` ticks and at the last one, and writes ``k`` to
``<checkpoints>/latest_checkpointed_iteration.txt``. That tracker is what the run reached, across resumes;
verl can exit 0 having trained nothing (a resume whose data loader is exhausted), so the driver compares
it with the ticks asked. HF folders come from verl's own checkpoint conversion (``verl.model_merger``,
FSDP backend: the shards merged into one ``safetensors`` model in bf16, with config and tokenizer) --
the same as ``python -m verl.model_merger merge --backend fsdp --local_dir ... --target_dir ...``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from commrl.staging import staged_dir

TRACKER = "latest_checkpointed_iteration.txt"


def latest_tick(checkpoint_dir: Path) -> int:
    """The tick of verl's newest complete checkpoint under ``checkpoint_dir`` (0: none)."""
    tracker = Path(checkpoint_dir) / TRACKER
    if not tracker.exists():
        return 0
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise ValueError(f"{tracker} holds {text!r}, not a tick number; the checkpoint folder is damaged")
    return int(text)


def actor_checkpoint(checkpoint_dir: Path, tick: int) -> Path:
    return Path(checkpoint_dir) / f"global_step_{tick}" / "actor"


def export_hf(checkpoint_dir: Path, tick: int, target: Path) -> Path:
    """The actor checkpoint of ``tick`` as a Hugging Face folder at ``target`` (replaced atomically)."""
    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    source = actor_checkpoint(checkpoint_dir, tick)
    if not (source / "huggingface").is_dir():
        raise FileNotFoundError(f"{source} is not a verl FSDP actor checkpoint (no huggingface/ in it)")
    target = Path(target)
    with staged_dir(target) as stage:
        merger = FSDPModelMerger(
            ModelMergerConfig(
                operation="merge",
                backend="fsdp",
                local_dir=str(source),
                target_dir=str(stage),
                hf_model_config_path=str(source / "huggingface"),
            )
        )
        merger.merge_and_save()
        merger.cleanup()
    return target


@dataclass(frozen=True)
class RunSummary:
    """What ``DIR/summary.json`` says about one cluster run."""

    ticks_trained: int
    ticks_asked: int
    mlflow_run_id: str | None
    final: str | None
    read_at: int
    read_checkpoint: str | None

    @property
    def complete(self) -> bool:
        return self.ticks_trained >= self.ticks_asked


def write_json(path: Path, payload: dict) -> None:
    """Write JSON through a temporary file and a rename (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def finish_run(out_dir: Path, ticks_asked: int, read_at: int, mlflow_run_id: str | None) -> RunSummary:
    """Count the ticks trained, export ``DIR/final`` (the last tick) and ``DIR/tick<read_at>``, write
    ``DIR/summary.json``.

    The read-point folder is written only when the read point is an earlier checkpoint than the last one
    (the KL runs of pair A go to 150 ticks and are read at 100); otherwise ``final`` is the read point.
    """
    out_dir = Path(out_dir)
    checkpoints = out_dir / "checkpoints"
    trained = latest_tick(checkpoints)
    final = read = None
    if trained > 0:
        final = str(export_hf(checkpoints, trained, out_dir / "final"))
        read = final if read_at == trained else None
        if read_at < trained and actor_checkpoint(checkpoints, read_at).is_dir():
            read = str(export_hf(checkpoints, read_at, out_dir / f"tick{read_at}"))
    summary = RunSummary(trained, ticks_asked, mlflow_run_id, final, read_at, read)
    write_json(out_dir / "summary.json", {**asdict(summary), "complete": summary.complete})
    return summary
