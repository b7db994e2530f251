"""Prepared dataset directories: ``<split>.parquet``, ``<split>.jsonl`` (held-out) and ``manifest.json``.

Writes are all-or-nothing: every file is first written into a hidden staging folder inside the output
directory and moved into place (``os.replace``) only after all of them were written, the manifest last.
On any error the staging folder is removed and the output directory keeps what it had before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from commrl.data.schema import DataError

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class PreparedDataset:
    """Rows per split (verl schema), the held-out split names (they also get a jsonl) and the manifest."""

    splits: dict[str, list[dict[str, Any]]]
    held_out: tuple[str, ...]
    manifest: dict[str, Any]


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_dataset(
    out_dir: str | Path, prepared: PreparedDataset, created_by: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write each split as verl parquet (+ jsonl with ``problem``, ``answer``, ``prompt`` for held-out splits)
    and ``manifest.json``: the prepared manifest, ``created_by`` and an ``outputs`` entry (rows, sha256)
    per file. Returns the manifest as written.
    """
    splits, held_out = prepared.splits, prepared.held_out
    for split, rows in splits.items():
        if not rows:
            raise DataError(f"split {split!r} has no rows left to write; check the source and the rejects")
    out = Path(out_dir)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        outputs: dict[str, dict[str, Any]] = {}
        for split, rows in splits.items():
            path = stage / f"{split}.parquet"
            pq.write_table(pa.Table.from_pylist(rows), path)
            outputs[path.name] = {"split": split, "rows": len(rows), "sha256": sha256_file(path)}
            if split in held_out:
                path = stage / f"{split}.jsonl"
                with open(path, "w", encoding="utf-8") as f:
                    for row in rows:
                        record = {
                            "problem": row["extra_info"]["problem"],
                            "answer": row["reward_model"]["ground_truth"],
                            "prompt": row["prompt"][0]["content"],
                        }
                        f.write(json.dumps(record, ensure_ascii=False) + "\n")
                outputs[path.name] = {"split": split, "rows": len(rows), "sha256": sha256_file(path)}
        manifest = {**prepared.manifest, "created_by": created_by or {}, "outputs": outputs}
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        for name in [*outputs, MANIFEST]:
            os.replace(stage / name, out / name)
        return manifest
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def read_split(data_dir: str | Path, split: str) -> list[dict[str, Any]]:
    """The rows of ``<data_dir>/<split>.parquet`` as dicts (the verl schema)."""
    path = Path(data_dir) / f"{split}.parquet"
    if not path.is_file():
        raise DataError(
            f"{path} does not exist; prepare it first with `commrl prepare --out {Path(data_dir)}`"
        )
    return pq.read_table(path).to_pylist()
