"""Per-problem scores of the generative benchmarks (lm-eval ``process_results`` functions).

A response scores 1 when its last ``\\boxed{}`` verifies against the answer with math-verify
(``commrl.rl.reward.boxed_reward``, the training reward), else 0. For a problem with responses
``r_1..r_k`` (method.md §5, "avg@8"):

    acc    = (1/k) * sum_i score(r_i)       (mean@1 when k = 1; its mean over problems is avg@k)
    pass@k = max_i score(r_i)               (its mean over problems is pass@k)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from commrl.rl.reward import boxed_reward


def problem_scores(answer: str, responses: Sequence[str]) -> dict[str, float]:
    """``{"acc": mean score, "pass@k": max score}`` over the ``k`` responses to one problem."""
    if not responses:
        raise ValueError("no responses to score; the task's filter must keep every sample (take_first_k)")
    scores = [boxed_reward(response, answer) for response in responses]
    return {"acc": sum(scores) / len(scores), f"pass@{len(scores)}": max(scores)}


def process_greedy(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """mean@1: ``results`` is ``[response]`` (lm-eval's ``take_first`` filter)."""
    return {"acc": boxed_reward(results[0], doc["answer"])}


def process_avg_k(doc: dict[str, Any], results: list[list[str]]) -> dict[str, float]:
    """avg@k and pass@k: ``results`` is ``[[r_1, ..., r_k]]`` (lm-eval's ``take_first_k`` filter)."""
    return problem_scores(doc["answer"], results[0])
