"""Write a whole output folder or nothing: a staging folder that replaces the output only on success."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def staged_dir(out: str | Path) -> Iterator[Path]:
    """A staging directory beside ``out``: on success it replaces ``out`` as a whole, on error it vanishes.

    The previous ``out`` is moved aside first and removed only once the new one is in place, so an error (or a
    kill) at any point leaves either the old folder or the new one, never a half-written mix.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
    try:
        yield stage
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(stage, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(stage, out)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
