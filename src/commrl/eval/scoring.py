"""Per-problem scores of the generative benchmarks (lm-eval ``process_results`` functions).

A response scores 1 when its last ``\\boxed{}`` verifies against the answer with math-verify
(``commrl.rl.reward.boxed_reward``, the training reward), else 0. For a problem with responses
``r_1..r_k`` (method.md §5, "avg@8"):

    acc    = (1/k) * sum_i score(r_i)       (mean@1 when k = 1; its mean over problems is avg@k)
    pass@k = max_i score(r_i)               (its mean over problems is pass@k)
    boxed  = (1/k) * sum_i [r_i ends in a non-empty \\boxed{}]

``boxed`` says how much of a score is the answer's format: a response the budget cut off before it boxed
an answer has no box and scores 0 whatever it would have answered (pair B's 4096 tokens, where the
literature's R1-distilled evaluations allow 32768); one cut off after a box (a chain of thought that went on
checking) is read at that box, as verl reads it, and counts as boxed.

A multiple-choice question (MMLU-STEM) is answered by an option's letter: the response scores 1 when its
last ``\boxed{}`` names the right one (``letter_reward``, Qwen2.5-Math's ``choice_answer_clean`` on the
box: the last standalone A-E in it, so ``\boxed{C}``, ``\boxed{(C)}`` and ``\boxed{\text{C. } 12}``
all read C). Qwen2.5-Math's evaluation reads that letter anywhere in the response; here, as for every
other benchmark, a response without a final box scores 0.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from commrl.data.boxed import last_boxed
from commrl.rl.reward import boxed_reward

_LETTER = re.compile(r"\b([A-E])\b")


def problem_scores(answer: str, responses: Sequence[str]) -> dict[str, float]:
    """``{"acc": mean score, "pass@k": max score}`` over the ``k`` responses to one problem."""
    if not responses:
        raise ValueError("no responses to score; the task's filter must keep every sample (take_first_k)")
    scores = [boxed_reward(response, answer) for response in responses]
    boxes = [has_box(response) for response in responses]
    return {
        "acc": sum(scores) / len(scores),
        f"pass@{len(scores)}": max(scores),
        "boxed": sum(boxes) / len(boxes),
    }


def has_box(response: str) -> float:
    """1.0 when ``response`` has a last ``\\boxed{}`` with something in it (the answer the scores read)."""
    box = last_boxed(response)
    return float(box is not None and bool(box.strip()))


def process_greedy(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """mean@1: ``results`` is ``[response]`` (lm-eval's ``take_first`` filter)."""
    return {"acc": boxed_reward(results[0], doc["answer"]), "boxed": has_box(results[0])}


def process_avg_k(doc: dict[str, Any], results: list[list[str]]) -> dict[str, float]:
    """avg@k and pass@k: ``results`` is ``[[r_1, ..., r_k]]`` (lm-eval's ``take_first_k`` filter)."""
    return problem_scores(doc["answer"], results[0])


def choice_letter(text: str) -> str | None:
    """The last standalone option letter A-E in ``text``, upper-cased (Qwen2.5-Math's
    ``choice_answer_clean``: ``re.findall(r"\\b(A|B|C|D|E)\\b", pred.upper())[-1]``); None without one."""
    letters = _LETTER.findall(text.upper())
    return letters[-1] if letters else None


def letter_reward(response: str, letter: str) -> float:
    """1.0 if the last ``\\boxed{}`` of ``response`` names the option ``letter``, else 0.0."""
    box = last_boxed(response)
    return float(box is not None and choice_letter(box) == letter.strip().upper())


def process_greedy_letter(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """mean@1 of a multiple-choice question answered by its letter (``letter_reward``)."""
    return {"acc": letter_reward(results[0], doc["answer"]), "boxed": has_box(results[0])}
