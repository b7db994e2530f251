"""The reward: the integer fast path gives math-verify's verdict; answers outside a box score 0; math-verify
is bounded in any thread."""

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
    assert compute_score("toy", "\\boxed{7}", "7") == {"score": 1.0, "acc": 1.0}


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
