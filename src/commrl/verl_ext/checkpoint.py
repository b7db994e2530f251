"""After a cluster run: how many ticks verl trained, the HF folders of its checkpoints, ``summary.json``
(``commrl.run.summary``, the schema both drivers write).

verl's trainer saves ``<checkpoints>/global_step_<k>/actor/`` (sharded FSDP state + ``huggingface/`` with
the config and tokenizer) every ``trainer.save_freq`` ticks and at the last one, and writes ``k`` to
``<checkpoints>/latest_checkpointed_iteration.txt``. That tracker is what the run reached, across resumes;
verl can exit 0 having trained nothing (a resume whose data loader is exhausted), so the driver compares
it with the ticks asked. HF folders come from verl's own checkpoint conversion (``verl.model_merger``,
FSDP backend: the shards merged into one ``safetensors`` model in bf16, with config and tokenizer) --
the same as ``python -m verl.model_merger merge --backend fsdp --local_dir ... --target_dir ...``.

Beside them, ``DIR/run_config.json`` is the run's config fingerprint (``commrl.run.fingerprint``): written
before verl's first step, checked by every resume (``record_run_config``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from commrl import tracking
from commrl.eval.atomic import write_text_atomic
from commrl.run import fingerprint
from commrl.run.summary import FINAL_DIR, RunSummary, read_point, read_point_dir_name
from commrl.staging import staged_dir
from commrl.verl_ext.config import VerlRun, local_model_folder, on_schedule

TRACKER = "latest_checkpointed_iteration.txt"
STEP_PREFIX = "global_step_"  # verl's folder of the checkpoint of tick k: global_step_<k>
RUN_CONFIG = "run_config.json"
LOADER_STATE = "data.pt"  # verl's train loader state (torchdata's StatefulDataLoader) in a step's folder
VAL_ACC = "val/acc"  # what summary.json and the report read (trainer.method_metrics: from verl's val-core/*)


def latest_tick(checkpoint_dir: Path) -> int:
    """The tick of verl's newest complete checkpoint under ``checkpoint_dir`` (0: none)."""
    tracker = Path(checkpoint_dir) / TRACKER
    if not tracker.exists():
        return 0
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise ValueError(f"{tracker} holds {text!r}, not a tick number; the checkpoint folder is damaged")
    return int(text)


def prune_checkpoints(checkpoint_dir: Path, keep: int, read_at: int) -> list[int]:
    """Delete the ``global_step_<k>`` folders that verl's ``trainer.max_actor_ckpt_to_keep = keep`` would
    have deleted in one process: of the complete ones (up to the tracker's tick), all but the ``keep``
    newest and the read point's (``read_at``). Returns the deleted ticks, oldest first.

    verl's checkpoint manager deletes only what its own process saved, so every resume would leave up to
    ``keep`` of the earlier attempts' checkpoints on disk for good (pair A: ~45 GB each). ``keep = 0``
    (verl's keep-all) deletes nothing; a folder past the tracker (a save cut off) is verl's to overwrite.
    """
    if keep <= 0:
        return []
    root = Path(checkpoint_dir)
    latest = latest_tick(root)
    saved = sorted(
        int(d.name.removeprefix(STEP_PREFIX))
        for d in root.glob(f"{STEP_PREFIX}*")
        if d.is_dir() and d.name.removeprefix(STEP_PREFIX).isdigit()
    )
    complete = [t for t in saved if t <= latest]
    stale = [t for t in complete[:-keep] if t != read_at]
    for tick in stale:
        shutil.rmtree(step_dir(root, tick))
    return stale


def resolved_config(spec: VerlRun, cfg, digests: bool = True) -> dict[str, Any]:
    """What the run computes with (``commrl.run.fingerprint``): its identity, read point and method, verl's
    composed config ``cfg`` under ``verl`` and, with ``digests``, what its model and data hold under
    ``digest`` (``content_digests``)."""
    from omegaconf import OmegaConf

    values = {
        "pair": spec.pair,
        "condition": spec.condition,
        "seed": spec.seed,
        "read_at": spec.read_at,
        "method": spec.method.to_dict(),
        "verl": OmegaConf.to_container(cfg, resolve=True),
    }
    if digests and (held := content_digests(values["verl"])):
        values["digest"] = held
    return values


def content_digests(verl: Mapping[str, Any]) -> dict[str, str]:
    """``fingerprint.content_digest`` of the actor's model (``fingerprint.model_files`` of its folder here,
    ``local_model_folder``) as ``model``, and of verl's train and validation files as ``data``, from verl's
    resolved config ``verl``; a part with no file on this machine is left out."""
    folder = local_model_folder(str(verl["actor_rollout_ref"]["model"]["path"]))
    data = []
    for files in (verl["data"]["train_files"], verl["data"]["val_files"]):
        data += [Path(f).expanduser() for f in ([files] if isinstance(files, str) else files)]
    parts = {"model": fingerprint.model_files(folder) if folder else [], "data": data}
    return {part: digest for part, files in parts.items() if (digest := fingerprint.content_digest(files))}


def record_run_config(out_dir: Path, spec: VerlRun, cfg) -> None:
    """Check a resume against ``DIR/run_config.json`` (``fingerprint.check_resume``: a ``ConfigError`` when
    verl's checkpoints were trained under another config), then write the run's fingerprint there.

    A resume is a run whose ``trainer.default_local_dir`` holds a checkpoint; without one the record is
    (re)written, as nothing was trained yet.
    """
    out_dir = Path(out_dir)
    current = fingerprint.of(resolved_config(spec, cfg))
    checkpoints = Path(cfg.trainer.default_local_dir)
    done = latest_tick(checkpoints)
    path = out_dir / RUN_CONFIG
    if done > 0:
        recorded = json.loads(path.read_text()) if path.is_file() else None
        inside = checkpoints.resolve().is_relative_to(out_dir.resolve())
        folders = [out_dir] if inside else [out_dir, checkpoints]
        fingerprint.check_resume(recorded, current, done, folders)
    write_text_atomic(path, json.dumps(current, indent=1, sort_keys=True) + "\n")


def restore_epoch_end(loader, step_folder: Path, step: int) -> bool:
    """At a checkpoint that ends an epoch, restore the train loader's state that verl 0.9.1 skips, so that
    the next epoch is the one an uninterrupted run draws; True when it did.

    verl's ``_load_checkpoint`` leaves the loader fresh when ``step`` is a multiple of its length (the saved
    iterator is exhausted): its sampler's generator then starts from the seed again and the resumed run
    repeats epoch 0's order, where an uninterrupted run draws the next permutation. Loading the saved state
    restores the generator; the exhausted epoch it resumes yields nothing and is run out here. A state that
    is not an exhausted epoch is left as verl left it.
    """
    import torch

    path = step_folder / LOADER_STATE
    steps = len(loader)
    if step <= 0 or steps == 0 or step % steps or not path.is_file():
        return False
    state = torch.load(path, weights_only=False)
    main = state.get("_snapshot", {}).get("_main_snapshot", state)  # with worker processes, or without
    if main.get("_sampler_iter_yielded") != steps:
        print(f"commrl: warning: {path} is not an epoch's end; the train loader starts afresh, as verl's")
        return False
    loader.load_state_dict(state)
    for _ in loader:
        raise RuntimeError(f"{path}: the restored epoch yielded a batch; it was saved exhausted")
    return True


def val_acc_history(run_id: str, tracking_uri: str | None = None) -> dict[int, float]:
    """``val/acc`` by step of the MLflow run ``run_id``."""
    history = tracking.client(tracking_uri).get_metric_history(run_id, VAL_ACC)
    return {int(m.step): float(m.value) for m in history}


def validation_missing(
    step: int, test_freq: int, total_steps: int, run_id: str | None, tracking_uri: str | None = None
) -> bool:
    """Whether step ``step``'s validation was due but the MLflow run ``run_id`` has no ``val/acc`` there.

    verl saves a ``save_freq`` step before it validates and logs it, so a hard kill during that validation
    leaves the checkpoint without its ``val/acc``. False without a run (nothing would record it).
    """
    if not run_id or not on_schedule(step, test_freq, total_steps):
        return False
    return step not in val_acc_history(run_id, tracking_uri)


def step_dir(checkpoint_dir: Path, tick: int) -> Path:
    """``<checkpoint_dir>/global_step_<tick>``: where verl saves (and resumes) tick ``tick``'s checkpoint."""
    return Path(checkpoint_dir) / f"{STEP_PREFIX}{tick}"


def actor_checkpoint(checkpoint_dir: Path, tick: int) -> Path:
    return step_dir(checkpoint_dir, tick) / "actor"


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


def summarize_run(
    out_dir: Path,
    spec: VerlRun,
    ticks_asked: int,
    mlflow_run_id: str | None,
    tracking_uri: str | None = None,
    checkpoints: Path | None = None,
) -> RunSummary:
    """Count the ticks trained, export ``DIR/final`` (the last tick) and ``DIR/tick<read_at>``, write
    ``DIR/summary.json`` (val/acc per validation from the run's MLflow history).

    ``checkpoints``: verl's ``trainer.default_local_dir`` (``DIR/checkpoints`` unless overridden, e.g. to a
    scratch file system).

    The read-point folder is written only when the read point is an earlier checkpoint than the last one
    (the KL runs of pair A go to 150 ticks and are read at 100); otherwise ``final`` is the read point.
    """
    out_dir = Path(out_dir)
    checkpoints = out_dir / "checkpoints" if checkpoints is None else Path(checkpoints)
    trained = latest_tick(checkpoints)
    final = None
    if trained > 0:
        final = str(export_hf(checkpoints, trained, out_dir / FINAL_DIR))
        if spec.read_at < trained and actor_checkpoint(checkpoints, spec.read_at).is_dir():
            export_hf(checkpoints, spec.read_at, out_dir / read_point_dir_name(spec.read_at))
    val_acc: dict[int, float] = {}
    if mlflow_run_id:
        val_acc = val_acc_history(mlflow_run_id, tracking_uri)
    summary = RunSummary(
        pair=spec.pair,
        condition=spec.condition,
        seed=spec.seed,
        driver="verl",
        ticks_asked=ticks_asked,
        ticks_trained=trained,
        mlflow_run_id=mlflow_run_id,
        final=final,
        read_at=spec.read_at,
        read=read_point(out_dir, spec.read_at, trained, final),
        val_acc=val_acc,
    )
    summary.write(out_dir)
    return summary
