"""The verifiable reward: 1 when the last ``\\boxed{}`` of a response verifies against the ground truth.

math-verify alone is lenient (it falls back to the last number of any text), so the answer is required
in ``\\boxed{}``: a response without a complete box scores 0. ``compute_score`` has verl's custom reward
signature, so the cluster driver uses the same function (``reward.custom_reward_function``).
"""

from __future__ import annotations

import re
import threading
from typing import Any

from commrl.data.boxed import last_boxed

_INTEGER = re.compile(r"[+-]?\d+")


def verify_answer(ground_truth: str, answer: str) -> bool:
    """math-verify equivalence of two answers written as LaTeX (``verify(gold, pred)``; order matters)."""
    from math_verify import parse, verify

    in_main = threading.current_thread() is threading.main_thread()
    timeout = 5 if in_main else None  # math-verify's timeouts use signal.alarm: main thread only
    try:
        gold = parse(f"${ground_truth}$", parsing_timeout=timeout)
        pred = parse(f"${answer}$", parsing_timeout=timeout)
        return bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=timeout))
    except Exception:
        return False


def boxed_reward(response: str, ground_truth: str) -> float:
    """1.0 if the last ``\\boxed{}`` in ``response`` verifies against ``ground_truth``, else 0.0."""
    answer = last_boxed(response)
    if answer is None or not answer.strip():
        return 0.0
    answer, truth = answer.strip(), str(ground_truth).strip()
    if answer == truth:
        return 1.0
    if _INTEGER.fullmatch(answer) and _INTEGER.fullmatch(truth):  # math-verify's verdict, ~1000x faster
        return float(int(answer) == int(truth))
    return 1.0 if verify_answer(truth, answer) else 0.0


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **kwargs: Any
) -> dict[str, float]:
    """verl's custom reward function: ``{"score": r, "acc": r}`` with ``r = boxed_reward(...)``."""
    r = boxed_reward(solution_str, ground_truth)
    return {"score": r, "acc": r}
