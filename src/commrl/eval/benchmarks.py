"""The benchmark registry: the single source of truth for what ``commrl eval --benchmark NAME`` runs.

Each entry names the lm-eval task (the same string is the MLflow benchmark name), where its problems come
from (a hub id, or a local jsonl written by ``commrl prepare``), how it is scored and its generation
settings. Task YAMLs are generated from these entries at run time (``commrl.eval.lmeval_task``), so data
paths and response budgets live in one place.

Kinds (method.md §5: "greedy, mean@1" and "temperature 0.7, avg@8"):

- ``greedy``: one greedy response per problem, mean@1 = the fraction verified.
- ``avg@k``: ``k`` responses at temperature 0.7; avg@k = the mean over problems of the fraction of the
  ``k`` responses verified, pass@k = the fraction of problems with at least one verified response.
- ``mc``: log-likelihood multiple choice (the letter of the right option), accuracy.

A ``letter`` benchmark's answer is an option's letter (MMLU-STEM, as Qwen2.5-Math's evaluation runs it:
the question with ``Answer Choices: (A) ... (D) ...``, a greedy chain of thought, the letter in the last
``\boxed{}``); the others' are math answers, verified with math-verify.

Custom task names carry a prefix (``commrl_``, ``toy_``): a task in lm-eval's include path with a
built-in's name would replace the built-in silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from commrl.data.schema import QWEN_MATH_TEMPLATE
from commrl.data.toy import TOY_TEMPLATE
from commrl.errors import ConfigError

GREEDY, AVG_K, MC = "greedy", "avg@k", "mc"
KINDS = (GREEDY, AVG_K, MC)
SAMPLED_TEMPERATURE = 0.7
STOP_STRINGS = ("<|im_end|>", "<|endoftext|>")  # lm-eval adds the tokenizer's own EOS to these
OLYMPIAD_CONFIG = "OE_TO_maths_en_COMP"  # open-ended, text-only, maths, English, competition
MATH_SCORING = "math-verify on the last \\boxed{} (commrl.rl.reward.boxed_reward)"
LETTER_SCORING = "the option letter in the last \\boxed{} (commrl.eval.scoring.letter_reward)"
MC_SCORING = "loglikelihood multiple choice"
MMLU_STEM_SUBJECTS = (
    "abstract_algebra", "anatomy", "astronomy", "college_biology", "college_chemistry",
    "college_computer_science", "college_mathematics", "college_physics", "computer_security",
    "conceptual_physics", "electrical_engineering", "elementary_mathematics", "high_school_biology",
    "high_school_chemistry", "high_school_computer_science", "high_school_mathematics", "high_school_physics",
    "high_school_statistics", "machine_learning",
)  # fmt: skip


@dataclass(frozen=True)
class HubSource:
    """A dataset on the Hugging Face hub: ``load_dataset(path, name, split=split)``."""

    path: str
    name: str | None = None
    split: str = "test"

    def describe(self) -> str:
        config = f", config {self.name!r}" if self.name else ""
        return f"hub dataset {self.path!r}{config}, split {self.split!r}"


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: lm-eval task name, data source, scoring kind and default generation settings.

    ``hub`` is the default source (None: a local jsonl must be given with ``--data``); ``subjects`` keeps
    the rows of those subjects only (the ``subject`` column: MMLU's STEM subjects). ``letter``: the answer
    is an option's letter (``LETTER_SCORING``). ``prompt_template`` renders a problem as the user message
    when the data has no ``prompt`` column (``mc`` prompts are built from the options instead). ``pair``:
    the one pair whose settings it is evaluated with when neither the caller nor the training run names a
    pair (the toy benchmarks: tiny); None: the caller must name it (a paper benchmark under tiny's 24-token
    budget would score ~0).
    """

    name: str
    kind: str
    hub: HubSource | None = None
    k: int = 1
    temperature: float = 0.0
    prompt_template: str = QWEN_MATH_TEMPLATE
    subjects: tuple[str, ...] = ()
    letter: bool = False
    pair: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"{self.name}: kind={self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == AVG_K and (self.k < 2 or self.temperature <= 0):
            raise ConfigError(f"benchmark {self.name}: avg@k needs k >= 2 and temperature > 0")
        if self.kind != AVG_K and (self.k != 1 or self.temperature != 0):
            raise ConfigError(f"benchmark {self.name}: kind {self.kind} is one greedy pass (k=1, T=0)")
        if self.letter and self.kind != GREEDY:
            raise ConfigError(f"benchmark {self.name}: letter answers are scored greedy (kind {GREEDY})")

    @property
    def scoring(self) -> str:
        """How a response is scored, in words (logged as the ``scoring`` param)."""
        if self.kind == MC:
            return MC_SCORING
        return LETTER_SCORING if self.letter else MATH_SCORING

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metrics the task reports (lm-eval names): ``acc``, plus ``pass@k`` for avg@k, and for a
        generated answer ``boxed``, the fraction of responses with a final box (``commrl.eval.scoring``)."""
        if self.kind == MC:
            return ("acc",)
        return ("acc", f"pass@{self.k}", "boxed") if self.kind == AVG_K else ("acc", "boxed")

    def generation_kwargs(self, max_gen_toks: int) -> dict[str, Any] | None:
        """lm-eval ``generation_kwargs`` for a response budget of ``max_gen_toks`` (None for ``mc``).

        Never a ``seed``: a per-request seed makes the ``k`` samples of avg@k identical. Sampled: the whole
        distribution (``top_p`` 1, ``top_k`` 0), as vLLM and verl's rollouts sample; transformers would
        otherwise fill in its own default ``top_k=50`` on the hf backend.
        """
        if self.kind == MC:
            return None
        if max_gen_toks < 1:
            raise ConfigError(f"max_gen_toks={max_gen_toks} must be >= 1 (the pair's response budget)")
        sampled = self.kind == AVG_K
        return {
            "until": list(STOP_STRINGS),
            "do_sample": sampled,
            "temperature": self.temperature,
            **({"top_p": 1.0, "top_k": 0} if sampled else {}),
            "max_gen_toks": int(max_gen_toks),
        }


def _hub(path: str, split: str, name: str | None = None) -> HubSource:
    return HubSource(path=path, name=name, split=split)


def _avg8(name: str, hub: HubSource | None, **kwargs: Any) -> Benchmark:
    return Benchmark(name, AVG_K, hub, k=8, temperature=SAMPLED_TEMPERATURE, **kwargs)


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("commrl_math500", GREEDY, _hub("HuggingFaceH4/MATH-500", "test")),
        Benchmark("commrl_minerva", GREEDY, _hub("math-ai/minervamath", "test")),
        Benchmark("commrl_olympiadbench", GREEDY, _hub("Hothan/OlympiadBench", "train", OLYMPIAD_CONFIG)),
        _avg8("commrl_amc23", _hub("math-ai/amc23", "test")),
        _avg8("commrl_aime24", _hub("Maxwell-Jia/AIME_2024", "train")),
        _avg8("commrl_aime25", _hub("math-ai/aime25", "test")),
        _avg8("commrl_aime26", _hub("MathArena/aime_2026", "train")),
        Benchmark(
            "commrl_mmlu_stem",
            GREEDY,
            _hub("cais/mmlu", "test", "all"),
            subjects=MMLU_STEM_SUBJECTS,
            letter=True,
        ),
        Benchmark("toy_greedy", GREEDY, prompt_template=TOY_TEMPLATE, pair="tiny"),
        _avg8("toy_avg8", None, prompt_template=TOY_TEMPLATE, pair="tiny"),
        Benchmark("toy_mc", MC, pair="tiny"),
    )
}


def get_benchmark(name: str) -> Benchmark:
    """The registered benchmark ``name``; an unknown name raises ``ConfigError`` listing the known ones."""
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise ConfigError(f"unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}") from None
