"""How the report names, colours and prints things: conditions, benchmarks, numbers, intervals."""

from __future__ import annotations

import math
from collections.abc import Iterable

from commrl.report.stats import CONFIDENCE, Interval

CONDITION_COLOURS: dict[str, str] = {
    "dense": "#2ca02c",  # green
    "method": "#1f77b4",  # blue
    "anchor_off": "#d62728",  # red
    "dropout": "#7f7f7f",  # grey
    "prf_mask": "#9467bd",  # purple
}
FALLBACK_COLOURS: tuple[str, ...] = (  # pairwise distinct from each other and the above (tests/report)
    "#ff7f0e",  # orange
    "#8c564b",  # brown
    "#e377c2",  # pink
    "#bcbd22",  # olive
    "#17becf",  # cyan
    "#393b79",  # navy
    "#ff00ff",  # magenta
    "#006d6d",  # teal
    "#000000",  # black
)
ASYNC_CONDITIONS: tuple[str, ...] = (  # asynchronous training (rl.staleness 1) and its rollout corrections
    "dense_async",
    "method_async",
    "method_async_tis",
    "method_async_icepop",
    "method_async_seq_rs",
    "dense_async_tis",
)
CONDITION_ORDER: tuple[str, ...] = (  # display order (the note's); conditions live in configs/condition/
    "dense",
    "method",
    "no_projection",
    "anchor_off",
    "anchor_only",
    "prf_mask",
    "dropout",
    "method_same_sampler",
    *ASYNC_CONDITIONS,
)

BENCHMARK_NAMES: dict[str, str] = {
    "commrl_math500": "MATH500",
    "commrl_minerva": "Minerva",
    "commrl_olympiadbench": "OlympiadBench",
    "commrl_mmlu_stem": "MMLU-STEM",
    "commrl_amc23": "AMC23",
    "commrl_aime24": "AIME24",
    "commrl_aime25": "AIME25",
    "commrl_aime26": "AIME26",
    "toy_greedy": "toy (greedy)",
    "toy_avg8": "toy (avg@8)",
    "toy_mc": "toy (multiple choice)",
}


def order_conditions(conditions: Iterable[str]) -> list[str]:
    """The note's conditions in the note's order, then any others alphabetically."""
    names = set(conditions)
    known = [c for c in CONDITION_ORDER if c in names]
    return known + sorted(names - set(known))


def condition_colours(conditions: Iterable[str]) -> dict[str, str]:
    """A fixed colour per known condition; the others take the fallback palette in alphabetical order."""
    colours = {}
    others = sorted(set(conditions) - set(CONDITION_COLOURS))
    for i, name in enumerate(others):
        colours[name] = FALLBACK_COLOURS[i % len(FALLBACK_COLOURS)]
    colours.update({c: col for c, col in CONDITION_COLOURS.items()})
    return colours


def benchmark_label(name: str) -> str:
    """The display name of an lm-eval task (the task name itself when it has none)."""
    return BENCHMARK_NAMES.get(name, name)


def order_benchmarks(names: Iterable[str]) -> list[str]:
    """Benchmarks in the note's order, then any others alphabetically."""
    names = set(names)
    known = [b for b in BENCHMARK_NAMES if b in names]
    return known + sorted(names - set(known))


def format_number(value: float, spec: str = ".4g") -> str:
    """NaN -> ``n/a``; large integral values (bytes) with thousands separators; others with ``spec``."""
    if math.isnan(value):
        return "n/a"
    if math.isfinite(value) and float(value).is_integer() and abs(value) >= 1e4:
        return f"{int(value):,}"
    return f"{value:{spec}}"


def seeds_text(interval: Interval) -> str:
    """``(n=3)``; ``(n=3 vs 2)`` for two unpaired conditions."""
    return f"(n={' vs '.join(str(k) for k in interval.sizes)})"


def format_interval(interval: Interval, spec: str = ".4g") -> str:
    """``0.654 ± 0.021 (n=3)`` (symmetric), ``0.654 [0.61, 0.68] (n=25)`` (asymmetric), ``0.654 (n=1)``;
    with a percent ``spec`` (``.1%``) the half-width and bounds are percents too (``74.3% ± 2.1%``); an
    interval at another level than 95% says which (``0.126 ± 0.32 (98.3%, n=3)``: a Bonferroni level)."""
    estimate = format_number(interval.estimate, spec)
    if interval.low is None or interval.high is None:
        return f"{estimate} {seeds_text(interval)}"

    def spread(value: float, digits: int) -> str:
        return f"{value * 100:.{digits}g}%" if spec.endswith("%") else format_number(value, f".{digits}g")

    seeds = seeds_text(interval)
    if not math.isclose(interval.confidence, CONFIDENCE):
        seeds = f"({interval.confidence * 100:.3g}%, {seeds[1:]}"
    if interval.symmetric:
        return f"{estimate} ± {spread(interval.half_width, 2)} {seeds}"
    return f"{estimate} [{spread(interval.low, 3)}, {spread(interval.high, 3)}] {seeds}"
