"""Atomic file writes: a temporary file in the target's folder, renamed over the target when complete."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

_UMASK = os.umask(0)
os.umask(_UMASK)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    return write_lines_atomic(path, [text])


def write_lines_atomic(path: str | Path, chunks: Iterable[str]) -> Path:
    """Write the concatenation of ``chunks`` to ``path`` atomically (parents are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for chunk in chunks:
                f.write(chunk)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
