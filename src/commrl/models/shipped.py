"""A shipped base policy: a checked-in output of ``commrl pretrain``, staged instead of trained, so that every
machine starts its RL runs from the same weights, as the paper pairs all start from one hub checkpoint.

Pretraining is not repeatable across machines: its float32 kernels differ by CPU, the difference grows
step by step, and the stopping rule turns it into another model. Measured on one CPU with its AVX-512 and
its AVX2 kernels (ATen, MKL, oneDNN): the loss curves part at step ~90 and the runs stop at step 230
(greedy accuracy 0.474) and step 220 (0.400), two base policies every RL number of the tiny pair depends
on, and which no seed of the RL runs covers.

``SHIPPED.json`` beside the weights says what was run and on what: the command, the ``PretrainConfig``, the
sha256 of the training data it read (``DATA_FILES``) and of every file of the directory. ``stage_shipped``
copies the directory to ``out`` only after checking all of them against the pretraining the caller asks
for, so a shipped base is never used for other data or another recipe, and a damaged or
Git-LFS-pointer file is refused.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from commrl.data.files import sha256_file
from commrl.data.schema import DataError
from commrl.errors import ConfigError
from commrl.models.pretrain import ACCURACY_FILE, PretrainConfig
from commrl.staging import staged_dir

MANIFEST = "SHIPPED.json"
DATA_FILES = ("train.parquet", "validation.parquet")  # what ``pretrain`` reads


def data_digests(data_dir: str | Path) -> dict[str, str]:
    """``file -> sha256`` of the training data ``pretrain`` reads from ``data_dir``."""
    digests = {}
    for name in DATA_FILES:
        path = Path(data_dir) / name
        if not path.is_file():
            raise DataError(f"{path}: no such file; prepare the data first (commrl prepare --dataset toy)")
        digests[name] = sha256_file(path)
    return digests


def write_manifest(
    model_dir: str | Path, data_dir: str | Path, command: str, made_with: dict[str, Any]
) -> Path:
    """Write ``SHIPPED.json`` for the ``commrl pretrain`` output in ``model_dir`` (its recipe is read from
    ``base_accuracy.json``); ``made_with``: where it was made (commit, torch, CPU capability, threads)."""
    model_dir = Path(model_dir)
    accuracy = json.loads((model_dir / ACCURACY_FILE).read_text())
    files = {
        p.name: sha256_file(p) for p in sorted(model_dir.iterdir()) if p.is_file() and p.name != MANIFEST
    }
    manifest = {
        "command": command,
        "made_with": made_with,
        "config": accuracy["config"],
        "data": data_digests(data_dir),
        "files": files,
    }
    path = model_dir / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def check_shipped(shipped: str | Path, data_dir: str | Path, cfg: PretrainConfig) -> dict[str, Any]:
    """The manifest of ``shipped`` once its files, its recipe and its training data are those asked for;
    ``ConfigError`` for another recipe or other data, ``DataError`` for a missing or damaged file."""
    shipped = Path(shipped)
    path = shipped / MANIFEST
    if not path.is_file():
        raise DataError(
            f"{path}: no such file; --shipped takes a directory with a {MANIFEST} (e.g. assets/tiny-base)"
        )
    manifest = json.loads(path.read_text())
    for name, want in manifest["files"].items():
        file = shipped / name
        if not file.is_file() or sha256_file(file) != want:
            raise DataError(
                f"{file}: missing or not the shipped file (sha256 differs from {MANIFEST}); restore it with "
                f"`git checkout -- {file}` (a Git LFS pointer needs `git lfs pull`)"
            )
    asked = asdict(cfg)
    differ = {k: (manifest["config"].get(k), v) for k, v in asked.items() if manifest["config"].get(k) != v}
    if differ:
        listed = ", ".join(f"pretrain.{k}: shipped {s!r}, asked {a!r}" for k, (s, a) in differ.items())
        raise ConfigError(
            f"the base policy in {shipped} was pretrained with another recipe ({listed}); ask for the "
            "shipped recipe, or drop the shipped base (pipeline config: pairs.<pair>.pretrain.shipped) to "
            "pretrain here"
        )
    data = data_digests(data_dir)
    if data != manifest["data"]:
        changed = ", ".join(k for k in DATA_FILES if data.get(k) != manifest["data"].get(k))
        raise ConfigError(
            f"the base policy in {shipped} was pretrained on other data ({changed} of {data_dir} differ "
            f"from {MANIFEST}); prepare the shipped dataset (the pipeline's datasets.toy.seed), or drop the "
            "shipped base (pairs.<pair>.pretrain.shipped) to pretrain on this data"
        )
    return manifest


def stage_shipped(
    shipped: str | Path, out_dir: str | Path, data_dir: str | Path, cfg: PretrainConfig
) -> dict[str, Any]:
    """Check ``shipped`` (``check_shipped``), then copy it to ``out_dir`` as a whole; return its
    ``base_accuracy.json`` (the pretraining's own read-outs)."""
    cfg.validate()
    check_shipped(shipped, data_dir, cfg)
    with staged_dir(out_dir) as stage:
        for file in Path(shipped).iterdir():
            if file.is_file():
                shutil.copyfile(file, stage / file.name)  # a fresh mtime: newer than its inputs
    return json.loads((Path(out_dir) / ACCURACY_FILE).read_text())
