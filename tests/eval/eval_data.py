"""Toy problems for the evaluation tests, in the layout the data stage writes."""

from __future__ import annotations

import json
import random
from pathlib import Path

from commrl.data.schema import format_prompt
from commrl.data.toy import TOY_TEMPLATE, expression


def toy_rows(n: int, seed: int = 0, with_prompt: bool = True) -> list[dict]:
    """``n`` toy problems in the layout ``commrl prepare --dataset toy`` writes: problem, answer, prompt."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        problem = expression((a, b), ("+",))
        row = {"problem": problem, "answer": str(a + b)}
        if with_prompt:
            row["prompt"] = format_prompt(TOY_TEMPLATE, problem)
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
