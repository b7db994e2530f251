"""verl's dataset row schema and the prompt template that turns a problem into the user message.

A row, as verl's ``RLHFDataset`` and reward manager read it::

    {"data_source": "commrl/math500",
     "prompt": [{"role": "user", "content": "<template with the problem in it>"}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "\\frac{1}{2}"},
     "extra_info": {"split": "test", "index": 0, "problem": "...", "answer": "\\frac{1}{2}", ...}}
"""

from __future__ import annotations

from typing import Any

PROBLEM_FIELD = "{problem}"
QWEN_MATH_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{}."
ABILITY = "math"


class DataError(ValueError):
    """Bad dataset input or configuration; the message names the field or value and the fix."""


def validate_template(template: str) -> str:
    """Return ``template`` if it contains the ``{problem}`` placeholder, else raise ``DataError``."""
    if PROBLEM_FIELD not in template:
        raise DataError(
            f"prompt template {template!r} has no {PROBLEM_FIELD} placeholder; put {PROBLEM_FIELD} where the "
            f"problem text goes, e.g. {QWEN_MATH_TEMPLATE!r}"
        )
    return template


def format_prompt(template: str, problem: str) -> str:
    """The user message: ``template`` with every ``{problem}`` replaced (other braces are kept literally)."""
    return validate_template(template).replace(PROBLEM_FIELD, problem)


def verl_row(
    *,
    data_source: str,
    problem: str,
    ground_truth: str,
    split: str,
    index: int,
    template: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One dataset row in verl's schema; ``extra`` adds fields to ``extra_info``."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": format_prompt(template, problem)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {
            "split": split,
            "index": index,
            "problem": problem,
            "answer": ground_truth,
            **(extra or {}),
        },
    }
