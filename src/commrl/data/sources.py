"""Loading a dataset's raw rows from a Hugging Face hub id or from a local file or folder.

``source`` is a local path when it exists (a ``.jsonl``, ``.json`` or ``.parquet`` file, or a folder of
them, searched recursively; in a folder, files whose path names the wanted split, e.g.
``algebra/train-00000-of-00001.parquet``, are preferred, so a hub snapshot works as it is). Otherwise it
is a hub id, loaded with ``datasets.load_dataset`` (which also reads the local HF cache, offline too).

Every frame holds Python objects (``dtype=object``), never columns converted to ``float64``: an integer
stays an exact ``int`` next to floats or nulls, and a JSON number with a fraction or an exponent keeps the
text written in the file (``JsonNumber``), so that an answer such as ``0.30`` or ``123456789012345678``
reaches the ground truth as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from commrl.data.schema import DataError

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class JsonNumber(str):
    """A JSON number with a fraction or an exponent, as the text written in the file (``0.30``, ``1e-5``):
    parsing it as a binary float would change that text or round the value."""


def object_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows as a frame of Python objects: no column is converted to a numeric dtype."""
    return pd.DataFrame(records, dtype=object)


def is_local(source: str) -> bool:
    return Path(source).exists()


def load_rows(
    source: str, *, split: str, hub_configs: Sequence[str | None] = (None,), flag: str = "--source"
) -> pd.DataFrame:
    """All rows of ``split`` from ``source`` (one frame; hub configs concatenated in order).

    ``flag`` is the command-line option that names ``source``, quoted in error messages.
    """
    if is_local(source):
        return load_local(Path(source), split=split)
    if not HUB_ID.match(source):
        raise DataError(
            f"{flag} {source!r} is neither an existing local path nor a hub id of the form owner/name; "
            "pass a .jsonl/.json/.parquet file, a folder of them, or a Hugging Face dataset id"
        )
    return load_hub(source, split=split, configs=hub_configs, flag=flag)


def load_hub(
    hub_id: str, *, split: str, configs: Sequence[str | None], flag: str = "--source"
) -> pd.DataFrame:
    """``datasets.load_dataset(hub_id, config, split=split)`` for each config, concatenated."""
    import datasets
    from datasets.exceptions import DatasetNotFoundError

    frames = []
    for config in configs:
        try:
            ds = datasets.load_dataset(hub_id, config, split=split)
        except (ConnectionError, DatasetNotFoundError, FileNotFoundError) as err:
            raise DataError(unreachable_message(hub_id, config, split, err, flag)) from err
        except ValueError as err:  # e.g. the dataset has no such split or config
            raise DataError(
                f"hub dataset {hub_id!r} ({flag}) cannot give split {split!r}"
                f"{'' if config is None else f' of config {config!r}'}: {err}"
            ) from err
        frames.append(object_frame(ds.to_list()))
    return pd.concat(frames, ignore_index=True)


def unreachable_message(hub_id: str, config: str | None, split: str, err: Exception, flag: str) -> str:
    """How to supply a dataset the hub cannot serve here."""
    config_arg = "" if config is None else f", {config!r}"
    call = f"datasets.load_dataset({hub_id!r}{config_arg}, split={split!r})"
    which = f"split {split!r}" + ("" if config is None else f", config {config!r}")
    return (
        f"cannot load hub dataset {hub_id!r} ({flag}; {which}): "
        f"{type(err).__name__}: {err}. "
        "This machine cannot reach the Hugging Face hub and has no cached copy. Either (1) pass a local "
        f"copy with {flag} PATH (a .jsonl, .json or .parquet file, or a folder of them such as the snapshot "
        f"`hf download {hub_id} --repo-type dataset --local-dir DIR` makes), or (2) run "
        f"`{call}` once on a networked node sharing HF_HOME (the HF cache) with this one, then rerun here "
        "with HF_DATASETS_OFFLINE=1."
    )


def local_files(folder: Path, split: str) -> list[Path]:
    """Data files under ``folder``; those whose relative path names ``split`` when there are any."""
    files = sorted(
        p for p in folder.rglob("*") if p.is_file() and p.suffix in LOCAL_SUFFIXES and not _hidden(p, folder)
    )
    if not files:
        raise DataError(
            f"folder {folder} has no {'/'.join(LOCAL_SUFFIXES)} files; point --source at the data"
        )
    named = [p for p in files if split in re.split(r"[^A-Za-z0-9]+", str(p.relative_to(folder)))]
    return named or files


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def load_local(path: Path, *, split: str) -> pd.DataFrame:
    """Rows of a local file, or of the split's files in a local folder (concatenated in path order)."""
    files = local_files(path, split) if path.is_dir() else [path]
    return pd.concat([read_file(f) for f in files], ignore_index=True)


def read_file(path: Path) -> pd.DataFrame:
    """One ``.jsonl``, ``.json`` (a list of records, or an object holding one) or ``.parquet`` file."""
    try:
        if path.suffix == ".parquet":
            return object_frame(pq.read_table(path).to_pylist())
        if path.suffix == ".jsonl":
            return object_frame(read_jsonl(path))
        if path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"), parse_float=JsonNumber)
            if isinstance(data, dict):
                lists = [v for v in data.values() if isinstance(v, list)]
                if len(lists) != 1:
                    raise DataError(
                        f"{path}: a .json file must hold a list of records (or an object with one list)"
                    )
                data = lists[0]
            return object_frame(check_records(data, path))
    except (ValueError, OSError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"cannot read {path}: {err}") from err
    raise DataError(f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(LOCAL_SUFFIXES)}")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a ``.jsonl`` file, one JSON object per non-blank line, numbers as written."""
    records = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line, parse_float=JsonNumber)
            except json.JSONDecodeError as err:
                raise DataError(
                    f"{path}, line {number}: not valid JSON ({err}); each line must be one JSON object"
                ) from err
            if not isinstance(record, dict):
                raise DataError(
                    f"{path}, line {number}: a {type(record).__name__}, not a JSON object; each line must "
                    'be one record such as {"problem": ..., "answer": ...}'
                )
            records.append(record)
    return records


def check_records(data: Any, path: Path) -> list[dict[str, Any]]:
    """``data`` when it is a list of JSON objects; else the error names the first bad record."""
    if not isinstance(data, list):
        raise DataError(f"{path}: a .json file must hold a list of records (or an object with one list)")
    for number, record in enumerate(data):
        if not isinstance(record, dict):
            raise DataError(
                f"{path}: record {number} of the list is a {type(record).__name__}, not a JSON object; "
                'every record must be an object such as {"problem": ..., "answer": ...}'
            )
    return data
