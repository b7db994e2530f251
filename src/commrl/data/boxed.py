"""Extraction of the final answer written as ``\\boxed{...}`` (nested braces handled)."""

from __future__ import annotations

BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced.

    ``\\boxed 5`` (no braces) yields the token after the space. Returns None when there is no box, or when
    the last one is cut off (a truncated response): an earlier box is not the final answer (verl's
    ``last_boxed_only_string`` reads it the same way).
    """
    start = max(text.rfind(cmd) for cmd in BOX_COMMANDS)
    return _box_content(text, start) if start >= 0 else None


def _box_content(text: str, start: int) -> str | None:
    cmd = next(c for c in BOX_COMMANDS if text.startswith(c, start))
    i = start + len(cmd)
    if i < len(text) and text[i] == " ":
        rest = text[i + 1 :].split("$")[0].split()
        return rest[0] if rest else None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None
