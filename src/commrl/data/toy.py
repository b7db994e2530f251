"""The toy task: procedurally generated integer arithmetic with answers verifiable as ``\\boxed{...}``.

A problem is an expression such as ``47+18`` (``n_operands`` operands of exactly ``digits`` digits, the
operators drawn from ``operators``, usual precedence); the answer is its integer value and the ideal
response is ``\\boxed{65}``. Problems are drawn without replacement from the whole problem space, so the
train, validation and test splits share no problem text; everything is deterministic by seed. Rows use
the same verl schema as MATH (``data_source = "commrl/toy_arith"``), so the pipeline cannot tell them apart.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import asdict, dataclass
from typing import Any

from commrl.data.files import PreparedDataset
from commrl.data.schema import DataError, validate_template, verl_row

DATA_SOURCE = "commrl/toy_arith"
TOY_TEMPLATE = "{problem}="
OPERATORS = "+-*"
SPLITS = ("train", "validation", "test")
HELD_OUT = ("validation", "test")
ENUMERATE_FRACTION = 0.25


@dataclass(frozen=True)
class ToyConfig:
    """Sizes, difficulty knobs and prompt template of the toy task."""

    seed: int = 0
    n_train: int = 5000
    n_validation: int = 500
    n_test: int = 500
    digits: int = 2
    operators: str = "+"
    n_operands: int = 2
    prompt_template: str = TOY_TEMPLATE

    def validate(self) -> ToyConfig:
        """Raise ``DataError`` naming the bad field, its value and the allowed range; return self."""
        for name in ("n_train", "n_validation", "n_test"):
            if getattr(self, name) < 1:
                raise DataError(f"toy.{name}={getattr(self, name)} must be >= 1")
        if not 1 <= self.digits <= 9:
            raise DataError(f"toy.digits={self.digits} must be in 1..9")
        if not 2 <= self.n_operands <= 6:
            raise DataError(f"toy.n_operands={self.n_operands} must be in 2..6")
        if (
            not self.operators
            or set(self.operators) - set(OPERATORS)
            or len(set(self.operators)) != len(self.operators)
        ):
            raise DataError(
                f"toy.operators={self.operators!r} must be distinct characters from {OPERATORS!r}"
            )
        validate_template(self.prompt_template)
        total, space = self.n_train + self.n_validation + self.n_test, problem_space_size(self)
        if total > space:
            raise DataError(
                f"toy: n_train + n_validation + n_test = {total} exceeds the {space} distinct problems of "
                f"digits={self.digits}, operators={self.operators!r}, n_operands={self.n_operands}; "
                "lower the split sizes or raise a difficulty knob"
            )
        return self


def operand_range(digits: int) -> range:
    """Integers with exactly ``digits`` digits (0..9 for one digit)."""
    return range(0 if digits == 1 else 10 ** (digits - 1), 10**digits)


def problem_space_size(cfg: ToyConfig) -> int:
    """Number of distinct expressions (operand tuples x operator tuples)."""
    return len(operand_range(cfg.digits)) ** cfg.n_operands * len(cfg.operators) ** (cfg.n_operands - 1)


def evaluate(operands: tuple[int, ...], ops: tuple[str, ...]) -> int:
    """Value of ``o0 op0 o1 op1 ...`` with ``*`` binding tighter than ``+`` and ``-`` (left to right)."""
    terms, signs = [operands[0]], [1]
    for op, x in zip(ops, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms, strict=True))


def expression(operands: tuple[int, ...], ops: tuple[str, ...]) -> str:
    """The problem text, e.g. ``47+18``."""
    return str(operands[0]) + "".join(f"{op}{x}" for op, x in zip(ops, operands[1:], strict=True))


def toy_response(answer: str) -> str:
    """The ideal response: the answer in a box, e.g. ``\\boxed{65}``."""
    return f"\\boxed{{{answer}}}"


def _draw_problems(cfg: ToyConfig, count: int) -> list[tuple[tuple[int, ...], tuple[str, ...]]]:
    """``count`` distinct (operands, operators) pairs, deterministic by ``cfg.seed``."""
    rng = random.Random(cfg.seed)
    numbers, n = operand_range(cfg.digits), cfg.n_operands
    if count > ENUMERATE_FRACTION * problem_space_size(cfg):
        space = list(
            itertools.product(
                itertools.product(numbers, repeat=n), itertools.product(cfg.operators, repeat=n - 1)
            )
        )
        return rng.sample(space, count)
    seen: set[tuple[tuple[int, ...], tuple[str, ...]]] = set()
    drawn = []
    while len(drawn) < count:
        item = (
            tuple(rng.choice(numbers) for _ in range(n)),
            tuple(rng.choice(cfg.operators) for _ in range(n - 1)),
        )
        if item not in seen:
            seen.add(item)
            drawn.append(item)
    return drawn


def generate_toy(cfg: ToyConfig) -> dict[str, list[dict[str, Any]]]:
    """The three splits as verl rows: ``{"train": [...], "validation": [...], "test": [...]}``."""
    cfg.validate()
    sizes = {"train": cfg.n_train, "validation": cfg.n_validation, "test": cfg.n_test}
    problems = iter(_draw_problems(cfg, sum(sizes.values())))
    splits: dict[str, list[dict[str, Any]]] = {}
    for split in SPLITS:
        rows = []
        for index in range(sizes[split]):
            operands, ops = next(problems)
            rows.append(
                verl_row(
                    data_source=DATA_SOURCE,
                    problem=expression(operands, ops),
                    ground_truth=str(evaluate(operands, ops)),
                    split=split,
                    index=index,
                    template=cfg.prompt_template,
                )
            )
        splits[split] = rows
    return splits


def prepare_toy(cfg: ToyConfig) -> PreparedDataset:
    """The toy splits and their manifest (generator settings, sizes, prompt template)."""
    splits = generate_toy(cfg)
    n = sum(len(rows) for rows in splits.values())
    manifest = {
        "dataset": "toy",
        "data_source": DATA_SOURCE,
        "source": "generated by commrl.data.toy",
        "source_kind": "generated",
        "toy_config": asdict(cfg),
        "problem_space": problem_space_size(cfg),
        "prompt_template": cfg.prompt_template,
        "rows_in": n,
        "rows_out": n,
        "rows_rejected": {},
        "rows_removed_overlap": 0,
    }
    return PreparedDataset(splits=splits, held_out=HELD_OUT, manifest=manifest)
