"""The reward: the integer fast path gives math-verify's verdict; answers outside a box score 0; e-notation
and small numbers are compared as numbers; math-verify is bounded in any thread."""

from __future__ import annotations

import threading
import time

import pytest

from commrl.rl.reward import VerifierProcess, boxed_reward, compute_score, hard_deadline, verify_answer

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
    assert boxed_reward("\\boxed{7} so far; finally \\boxed{7", "7") == 0.0  # the final box was cut off
    assert boxed_reward("\\boxed{\\frac{1}{2}} then \\fbox{1/2}", "0.5") == 1.0
    assert compute_score("toy", "\\boxed{7}", "7") == {"score": 1.0, "acc": 1.0}


SCIENTIFIC = [  # Minerva's ground truths are often e-notation, which math-verify reads as Euler's number
    (r"4.5 \times 10^{33}", "4.5e33", 1.0),
    (r"7.5\times10^{-8}", "7.5e-8", 1.0),
    ("0.002", "2e-3", 1.0),
    ("4.5e33", "4.5e33", 1.0),
    (r"3\times 10^{8}", "3E+8", 1.0),
    (r"4.6 \times 10^{33}", "4.5e33", 0.0),
    ("7.5", "7.5e-8", 0.0),
]
SMALL = [  # at least 3 significant digits of a small ground truth count (math-verify chops below 1e-15)
    (r"2\times10^{-19}", r"1\times10^{-19}", 0.0),
    (r"1.0\times10^{-19}", r"1\times10^{-19}", 1.0),
    (r"1.7\times10^{-19}", "1.6e-19", 0.0),
    ("0.00012", "1.2e-4", 1.0),
    (r"1.23\times 10^{-4}", "1.2e-4", 0.0),
    ("0.333333", r"\frac{1}{3}", 1.0),  # ground truths >= 1e-3 keep math-verify's own rounding
    ("0.7071068", r"\frac{\sqrt{2}}{2}", 1.0),
]


@pytest.mark.parametrize(("answer", "truth", "score"), SCIENTIFIC + SMALL)
def test_e_notation_and_small_numbers(answer, truth, score):
    assert boxed_reward(f"\\boxed{{{answer}}}", truth) == score


def in_thread(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a worker thread (as verl's reward executor calls it): (result, seconds);
    the thread is abandoned after 60 s (result None)."""
    out: dict = {}

    def call():
        start = time.monotonic()
        out["result"] = fn(*args, **kwargs)
        out["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(60)
    return out.get("result"), out.get("seconds")


HANG = "9^{9^{9^{9}}}"  # math-verify compares it with 1 until a timeout stops it


def test_verify_answer_off_the_main_thread_works_and_is_bounded():
    """From a non-main thread (no signal.alarm there): verdicts as in the main thread, and a comparison
    that would run unbounded scores False within its hard deadline."""
    assert in_thread(verify_answer, "0.5", "\\frac{1}{2}")[0] is True
    assert in_thread(verify_answer, "0.5", "\\frac{1}{3}")[0] is False
    result, seconds = in_thread(verify_answer, "1", HANG, timeout_s=1)
    assert result is False and seconds < hard_deadline(1)


def test_verifier_child_is_killed_at_the_hard_deadline_and_replaced():
    """A child that gives no verdict in time (its own timeout set past the deadline) is killed; the next
    call starts a fresh one."""
    verifier = VerifierProcess()
    verifier.verify("0.5", "\\frac{1}{2}", 5, 30.0)  # started
    start = time.monotonic()
    assert verifier.verify("1", HANG, 30, 1.0) is False
    assert time.monotonic() - start < 10 and verifier.proc is None
    assert verifier.verify("0.5", "\\frac{1}{2}", 5, 30.0) is True
    verifier.kill()


@pytest.mark.parametrize(
    "answer", ["93+73", "73 + 93", "100+66", "2 \\times 83", "332/2", "83\\cdot 2", "200 - 34", "2^{7}+38"]
)
def test_an_unevaluated_operation_is_no_integer_answer(answer):
    """math-verify evaluates it (the toy prompt 93+73= echoed in a box would score 1); the reward does not."""
    assert verify_answer("166", answer) or answer in ("2^{7}+38",)  # what math-verify alone would say
    assert boxed_reward(f"\\boxed{{{answer}}}", "166") == 0.0


@pytest.mark.parametrize(
    ("answer", "truth", "reward"),
    [
        ("2^{10}", "1024", 1.0),
        ("10^{6}", "1000000", 1.0),
        ("10^6", "1000000", 1.0),
        ("1.5 \\times 10^{3}", "1500", 1.0),
        ("2^{10}", "1000", 0.0),
        ("2^{7}+38", "166", 0.0),
        ("3\\cdot 5", "15", 0.0),
    ],
)
def test_a_power_or_scientific_notation_is_a_number_not_an_echoed_operation(answer, truth, reward):
    """The echo guard took ``2^{10}`` for 1024 (MATH500's and AIME's answers are integers) as an operation
    and scored it 0; a single power, or a mantissa times a power of 10, is how numbers are written, and
    the toy task (+ - * only) never asks for one. A product or a sum stays an echoed operation."""
    assert boxed_reward(f"\\boxed{{{answer}}}", truth) == reward


@pytest.mark.parametrize(
    ("answer", "truth"), [("1,000", "1000"), ("-5", "-5"), ("+5", "5"), ("5^\\circ", "5")]
)
def test_numbers_written_as_numbers_still_score(answer, truth):
    assert boxed_reward(f"\\boxed{{{answer}}}", truth) == 1.0
