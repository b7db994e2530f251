"""Write a whole output folder or nothing: a staging folder that replaces the output only on success."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def staged_dir(out: str | Path) -> Iterator[Path]:
    """A staging directory beside ``out``: on success it replaces ``out`` as a whole, on error it vanishes.

    The stage is made by a plain ``mkdir`` (mode ``0777 & ~umask``, the parent's default ACL), so the
    published ``out`` is as readable as any folder its writer makes. The swap is two renames: the old ``out``
    into a holding folder ``.<name>.old-*`` beside it, then the stage onto ``out``; the holding folder is
    removed once the new ``out`` is in place. Guarantees, for one writer of ``out`` at a time:

    - an error in the body or in either rename leaves the old ``out`` (or none, if there was none) in place;
    - a kill leaves the old ``out`` or the new one in place, except a kill between the two renames: that
      leaves ``out`` missing and the old one in ``.<name>.old-*``, and the next ``staged_dir(out)`` (a rerun)
      moves it back on entry before anything else, so the old version is never lost;
    - a reader never sees a half-written ``out`` (a mix of old and new files).

    On entry a leftover ``.<name>.old-*`` is moved back to ``out`` when ``out`` is missing (the newest, if
    several) and deleted otherwise, and a leftover stage ``.<name>.staging-*`` (a writer killed mid-write:
    for a verl export, gigabytes) is deleted.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _restore_held(out)
    left = re.compile(rf"\.{re.escape(out.name)}\.staging-[0-9a-f]{{8}}")
    for stale in [p for p in out.parent.iterdir() if left.fullmatch(p.name) and p.is_dir()]:
        shutil.rmtree(stale, ignore_errors=True)
    stage = _new_dir(out.parent, f".{out.name}.staging-")
    try:
        yield stage
        if out.exists():
            hold = _new_dir(out.parent, f".{out.name}.old-")
            os.replace(out, hold / out.name)
            try:
                os.replace(stage, out)
            except BaseException:
                os.replace(hold / out.name, out)
                shutil.rmtree(hold, ignore_errors=True)
                raise
            shutil.rmtree(hold, ignore_errors=True)
        else:
            os.replace(stage, out)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def _restore_held(out: Path) -> None:
    """Undo a swap a kill interrupted: move the newest ``.<name>.old-*/<name>`` back to ``out`` if ``out`` is
    missing, then delete every ``.<name>.old-*`` holding folder of ``out`` (whose parent exists)."""
    held = re.compile(rf"\.{re.escape(out.name)}\.old-[a-z0-9_]{{8}}")
    holds = [p for p in out.parent.iterdir() if held.fullmatch(p.name) and p.is_dir()]
    holds.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    if not out.exists() and not out.is_symlink():
        for hold in holds:
            if (hold / out.name).exists():
                os.replace(hold / out.name, out)
                break
    for hold in holds:
        shutil.rmtree(hold, ignore_errors=True)


def _new_dir(parent: Path, prefix: str) -> Path:
    """A new folder ``parent/<prefix><8 random hex>`` made by a plain ``mkdir`` (``tempfile.mkdtemp`` gives
    0700 whatever the umask, and a published folder keeps that mode)."""
    while True:
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
