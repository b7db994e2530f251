"""How the report names and colours things: conditions, benchmarks, metrics (the note's conventions)."""

from __future__ import annotations

from collections.abc import Iterable

from commrl.rl.config import CONDITIONS

CONDITION_COLOURS: dict[str, str] = {
    "dense": "#2ca02c",  # green
    "method": "#1f77b4",  # blue
    "anchor_off": "#d62728",  # red
    "dropout": "#7f7f7f",  # grey
    "prf_mask": "#9467bd",  # purple
}
FALLBACK_COLOURS: tuple[str, ...] = (
    "#ff7f0e",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#e7969c",
    "#637939",
    "#843c39",
)
CONDITION_ORDER: tuple[str, ...] = CONDITIONS  # the drivers' conditions, in the note's order

BENCHMARK_NAMES: dict[str, str] = {
    "commrl_math500": "MATH500",
    "commrl_minerva": "Minerva",
    "commrl_olympiadbench": "OlympiadBench",
    "mmlu_stem": "MMLU-STEM",
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
