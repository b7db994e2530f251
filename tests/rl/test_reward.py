"""The reward: the integer fast path gives math-verify's verdict; answers outside a box score 0."""

from __future__ import annotations

import pytest

from commrl.rl.reward import boxed_reward, compute_score, verify_answer

PAIRS = [
    ("173", "173"),
    ("0173", "173"),
    ("+5", "5"),
    ("-5", "5"),
    ("-0", "0"),
    ("172", "173"),
    ("-12", "-12"),
]


@pytest.mark.parametrize(("answer", "truth"), PAIRS)
def test_integer_fast_path_agrees_with_math_verify(answer, truth):
    assert boxed_reward(f"so \\boxed{{{answer}}}", truth) == float(verify_answer(truth, answer))


def test_non_integer_answers_go_to_math_verify():
    assert boxed_reward("\\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert boxed_reward("\\boxed{173.0}", "173") == 1.0
    assert boxed_reward("\\boxed{x}", "173") == 0.0
    assert boxed_reward("173", "173") == 0.0  # the answer must be boxed
    assert compute_score("toy", "\\boxed{7}", "7") == {"score": 1.0, "acc": 1.0}
