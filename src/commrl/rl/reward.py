"""The verifiable reward: 1 when the last ``\\boxed{}`` of a response verifies against the ground truth.

math-verify alone is lenient (it falls back to the last number of any text), so the answer is required
in ``\\boxed{}``: a response whose last box is missing or cut off scores 0. Three readings on top of
math-verify: an answer or ground truth written in e-notation (``4.5e33``, as Minerva's are) is read as
``4.5 \\times 10^{33}``, not with Euler's number; at least three significant digits of a small ground
truth count (math-verify's fixed decimals and chopping would take 2e-19 for 1e-19); and an integer ground
truth needs a number, not an unevaluated operation (math-verify computes ``\\boxed{93+73}`` to 166, so
echoing the toy task's prompt ``93+73=`` in a box would score). ``compute_score`` has
verl's custom reward signature, so the cluster driver uses the same function
(``reward.custom_reward_function``).

math-verify bounds its parsing and comparison with ``signal.alarm``, which only the main thread may use;
verl calls the reward from its executor threads. Off the main thread, ``verify_answer`` therefore hands the
pair to a verifier child process (``serve_verifier``: math-verify in that process's main thread, with its
timeouts), and kills and replaces the child when it does not answer within a hard deadline.
"""

from __future__ import annotations

import json
import math
import queue
import re
import select
import subprocess
import sys
import threading
from typing import Any

from commrl.data.boxed import last_boxed

_INTEGER = re.compile(r"[+-]?\d+")
# an operation between two numbers: ``93+73``, ``7 \times 8``, ``2^{10}``
_EXPRESSION = re.compile(r"\d\s*(?:[-+*/^×÷]|\\(?:times|cdot|div)\b)\s*[-+{(]?\s*\d")
# a number written as a power or in scientific notation, not an operation the question asked for: ``2^{10}``,
# ``10^6``, ``1.5 \times 10^{3}`` (the toy task's operators are + - *, so no echoed question has this form)
_NUMBER_NOTATION = re.compile(
    r"[+-]?\d+(?:\.\d+)?\s*(?:(?:\\times|\\cdot|×)\s*10\s*)?\^\s*(?:\{\s*[+-]?\d+\s*\}|[+-]?\d+)"
)
_E_NOTATION = re.compile(r"\s*([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)[eE]([+-]?\d+)\s*")
FLOAT_DECIMALS, NUMERIC_PRECISION = 6, 15  # math-verify's defaults (float_rounding, numeric_precision) ...
SIGNIFICANT_DIGITS = 3  # ... with more digits where the ground truth is small, so that this many of it count
VERIFY_TIMEOUT_S = 5  # math-verify's own timeout of each parse and of the comparison (whole seconds)
STARTUP_TIMEOUT_S = 120.0  # a verifier child's start (imports math-verify and sympy)
VERIFIERS = 4  # verifier children a process runs at most (one call each at a time)
_READY = "ready"


def scientific_latex(text: str) -> str:
    """A whole answer in e-notation as LaTeX: ``4.5e33`` -> ``4.5 \\times 10^{33}``; anything else as it is.

    math-verify reads ``e`` as Euler's number (``4.5e33`` = 4.5 * e * 33), so a correct ``4.5 \\times
    10^{33}`` would not verify against a ground truth written ``4.5e33`` (Minerva's are)."""
    match = _E_NOTATION.fullmatch(text)
    return f"{match[1]} \\times 10^{{{match[2]}}}" if match else text


def extra_digits(gold: list) -> int:
    """Digits math-verify's comparison needs beyond its defaults (floats rounded to ``FLOAT_DECIMALS``
    places; other differences evaluated to ``NUMERIC_PRECISION`` digits and chopped) for a small numeric
    ground truth, so that at least ``SIGNIFICANT_DIGITS`` of it count: 2e-19 is not 1e-19. 0 otherwise."""
    try:
        value = abs(float(gold[0]))
    except (IndexError, TypeError, ValueError):
        return 0
    if value == 0 or not math.isfinite(value):
        return 0
    return max(0, SIGNIFICANT_DIGITS - 1 - math.floor(math.log10(value)) - FLOAT_DECIMALS)


def _math_verify(ground_truth: str, answer: str, timeout_s: int) -> bool:
    """math-verify in this thread (the main thread: ``timeout_s`` > 0 uses ``signal.alarm``)."""
    from math_verify import parse, verify

    try:
        gold = parse(f"${scientific_latex(ground_truth)}$", parsing_timeout=timeout_s)
        pred = parse(f"${scientific_latex(answer)}$", parsing_timeout=timeout_s)
        if not (gold and pred):
            return False
        extra = extra_digits(gold)
        return bool(
            verify(
                gold,
                pred,
                float_rounding=FLOAT_DECIMALS + extra,
                numeric_precision=NUMERIC_PRECISION + extra,
                timeout_seconds=timeout_s,
            )
        )
    except Exception:
        return False


def hard_deadline(timeout_s: int) -> float:
    """Seconds a verifier child gets for one pair: its two parses and the comparison, plus a margin."""
    return 3.0 * timeout_s + 2.0


def verify_answer(ground_truth: str, answer: str, timeout_s: int = VERIFY_TIMEOUT_S) -> bool:
    """math-verify equivalence of two answers written as LaTeX (``verify(gold, pred)``; order matters).

    Bounded in any thread: math-verify's own timeouts in the main thread, a verifier child process with a
    hard deadline (``hard_deadline(timeout_s)``) elsewhere. A timeout scores False.
    """
    if threading.current_thread() is threading.main_thread():
        return _math_verify(ground_truth, answer, timeout_s)
    return _POOL.verify(ground_truth, answer, timeout_s, hard_deadline(timeout_s))


def serve_verifier() -> None:
    """A verifier child's loop: ``[ground_truth, answer, timeout_s]`` per stdin line -> ``true|false`` per
    stdout line; ends when stdin closes (the parent exited). Anything else printed goes to stderr."""
    protocol, sys.stdout = sys.stdout, sys.stderr
    import math_verify  # noqa: F401  (imported before the child reports ready)

    protocol.write(_READY + "\n")
    protocol.flush()
    for line in sys.stdin:
        ground_truth, answer, timeout_s = json.loads(line)
        protocol.write(json.dumps(_math_verify(ground_truth, answer, int(timeout_s))) + "\n")
        protocol.flush()


class VerifierProcess:
    """One verifier child (``python -c 'serve_verifier()'``), started on first use and after a kill."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def verify(self, ground_truth: str, answer: str, timeout_s: int, deadline_s: float) -> bool:
        """The child's verdict, or False when it gives none within ``deadline_s`` (the child is killed)."""
        proc = self._running()
        try:
            proc.stdin.write(json.dumps([ground_truth, answer, timeout_s]) + "\n")
            proc.stdin.flush()
            line = self._read_line(deadline_s)
        except BrokenPipeError:  # the child died (killed from outside, out of memory)
            line = None
        if line is None:
            self.kill()
            return False
        return bool(json.loads(line))

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def _running(self) -> subprocess.Popen:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from commrl.rl.reward import serve_verifier; serve_verifier()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self._read_line(STARTUP_TIMEOUT_S) != _READY:
            self.kill()
            raise RuntimeError(
                f"the math-verify child process ({sys.executable} -c 'from commrl.rl.reward import "
                f"serve_verifier; ...') did not start within {STARTUP_TIMEOUT_S:.0f} s; check that commrl "
                "and math-verify import in this environment (its stderr is this process's)"
            )
        return self.proc

    def _read_line(self, timeout_s: float) -> str | None:
        """The child's next stdout line, or None on a timeout or when it exited."""
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return line.strip() if line else None


class VerifierPool:
    """Up to ``size`` verifier children shared by the calling threads; a call waits for a free one."""

    def __init__(self, size: int = VERIFIERS) -> None:
        self._free: queue.Queue[VerifierProcess] = queue.Queue()
        for _ in range(size):
            self._free.put(VerifierProcess())

    def verify(self, ground_truth: str, answer: str, timeout_s: int, deadline_s: float) -> bool:
        verifier = self._free.get()
        try:
            return verifier.verify(ground_truth, answer, timeout_s, deadline_s)
        finally:
            self._free.put(verifier)


_POOL = VerifierPool()


def boxed_reward(response: str, ground_truth: str) -> float:
    """1.0 if the last ``\\boxed{}`` in ``response`` verifies against ``ground_truth``, else 0.0."""
    answer = last_boxed(response)
    if answer is None or not answer.strip():
        return 0.0
    answer, truth = answer.strip(), str(ground_truth).strip()
    if answer == truth:
        return 1.0
    if _INTEGER.fullmatch(truth) and _EXPRESSION.search(answer) and not _NUMBER_NOTATION.fullmatch(answer):
        return 0.0  # an echoed question is no answer; a power or 1.5 x 10^3 is a number
    if _INTEGER.fullmatch(answer) and _INTEGER.fullmatch(truth):  # math-verify's verdict, ~1000x faster
        return float(int(answer) == int(truth))
    return 1.0 if verify_answer(truth, answer) else 0.0


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **kwargs: Any
) -> dict[str, float]:
    """verl's custom reward function: ``{"score": r, "acc": r}`` with ``r = boxed_reward(...)``."""
    r = boxed_reward(solution_str, ground_truth)
    return {"score": r, "acc": r}
