"""``OracleLM``: an lm-eval model that solves the toy problems by reading the arithmetic in its prompt.

It has no weights; it exists to check the scoring path (filters, repeats, metrics) with exactly known
answers. ``right_of_k(doc_id)`` says on how many of a problem's samples it answers correctly (the first
ones); the others get a wrong boxed answer.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

from lm_eval.api.model import LM

from commrl.data.toy import evaluate

EXPRESSION = re.compile(r"\d+(?:[-+*]\d+)+")
OPTION = re.compile(r"^([A-D])\. (-?\d+)$", re.MULTILINE)


def solve(prompt: str) -> int:
    """The value of the first toy expression (``47+18``) in ``prompt``."""
    match = EXPRESSION.search(prompt)
    if match is None:
        raise ValueError(f"no toy expression in prompt {prompt!r}")
    text = match.group(0)
    operands = tuple(int(x) for x in re.findall(r"\d+", text))
    ops = tuple(re.findall(r"[-+*]", text))
    return evaluate(operands, ops)


class OracleLM(LM):
    """Answers ``\\boxed{<value>}`` (right) or ``\\boxed{<value + 1>}`` (wrong); picks the right option."""

    def __init__(self, right_of_k: Callable[[int], int] | None = None, fail_after: int | None = None):
        super().__init__()
        self.right_of_k = right_of_k
        self.fail_after = fail_after
        self.seen: Counter = Counter()
        self.contexts: list[str] = []

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for req in requests:
            if self.fail_after is not None and len(self.contexts) >= self.fail_after:
                raise RuntimeError("OracleLM: killed mid-evaluation")
            context, _ = req.args
            self.contexts.append(context)
            value = solve(context)
            n = self.seen[(req.task_name, req.doc_id)]
            self.seen[(req.task_name, req.doc_id)] += 1
            right = self.right_of_k is None or n < self.right_of_k(req.doc_id)
            out.append(f"so the answer is \\boxed{{{value if right else value + 1}}}")
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = []
        for req in requests:
            context, continuation = req.args
            self.contexts.append(context)
            value = solve(context)
            letter = next(letter for letter, option in OPTION.findall(context) if int(option) == value)
            right = continuation.strip() == letter
            out.append((0.0 if right else -10.0, right))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError("OracleLM scores no perplexity tasks")

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt=True) -> str:
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in chat_history)
        return text + ("<assistant>" if add_generation_prompt else "")

    @property
    def tokenizer_name(self) -> str:
        return "oracle"

    def chat_template(self, chat_template: bool | str = False) -> str:
        return "<role>content</role>"
