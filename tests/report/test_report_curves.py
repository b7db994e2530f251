"""The pure read-outs of the report: seeds combined per tick, value at the read tick, best, common tick."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from commrl.report import curves as cv
from commrl.report.runs import PairRuns, Series, TrainRun
from commrl.report.stats import mean_interval
from commrl.report.style import (
    CONDITION_COLOURS,
    CONDITION_ORDER,
    FALLBACK_COLOURS,
    condition_colours,
    order_conditions,
)


def series(points: dict[int, float]) -> Series:
    return Series.from_points(list(points.items()))


def test_aggregate_gives_the_seed_mean_and_its_interval_per_tick_over_the_seeds_that_logged_it():
    curve = cv.aggregate(
        [series({0: 1.0, 1: 2.0, 2: 3.0}), series({0: 3.0, 1: 4.0}), series({0: 2.0, 1: 3.0})]
    )
    assert curve.steps.tolist() == [0, 1, 2]
    assert curve.mean.tolist() == [2.0, 3.0, 3.0]
    assert curve.n.tolist() == [3, 3, 1] and curve.seeds == 3
    ref = mean_interval([1.0, 3.0, 2.0])  # tick 0
    assert (curve.low[0], curve.high[0]) == pytest.approx((ref.low, ref.high))
    assert np.isnan(curve.low[2]) and np.isnan(curve.high[2])  # one seed at tick 2: no band


def test_series_keeps_the_last_value_of_a_repeated_step_and_sorts():
    s = Series.from_points([(5, 1.0), (0, 2.0), (5, 3.0)])
    assert s.steps.tolist() == [0, 5]
    assert s.values.tolist() == [2.0, 3.0]


def test_value_at_takes_the_last_tick_not_after_the_read_tick():
    s = series({0: 0.1, 10: 0.2, 20: 0.3})
    assert cv.value_at(s, 20) == (20, 0.3)
    assert cv.value_at(s, 15) == (10, 0.2)
    assert cv.value_at(s, None) == (20, 0.3)
    assert cv.value_at(s, -1) is None
    assert cv.exact_at(s, 15) is None
    assert cv.exact_at(s, 10) == 0.2


def test_start_mean_best_and_mean_over_ticks():
    s = series({0: 0.1, 1: 0.2, 2: 0.3, 3: 0.9, 4: float("nan")})
    assert cv.start_mean(s) == pytest.approx(0.2)
    assert cv.best(s) == (3, 0.9)
    assert cv.mean_over_ticks(s) == pytest.approx(0.375)
    assert cv.best(series({0: float("nan")})) is None
    assert cv.mean_over_ticks(series({0: float("nan")})) is None


def test_curves_on_a_window_keep_the_ticks_up_to_it_and_the_seeds_that_logged_one():
    logged = {"0": series({0: 0.1, 5: 0.2, 10: 0.3}), "1": series({8: 0.5, 10: 0.6})}
    train = [TrainRun(s, s, "dense", "", s, "FINISHED", 5, 10, {"m": v}) for s, v in logged.items()]
    runs = PairRuns("P", train, [], [])
    (window,) = cv.curves(runs, "m", ["dense"], 5).values()
    assert window.steps.tolist() == [0, 5] and window.seeds == 1  # seed 1 starts after tick 5
    assert cv.curves(runs, "m", ["dense"])["dense"].steps.tolist() == [0, 5, 8, 10]
    assert cv.curves(runs, "m", ["dense"], -1) == {}
    assert cv.last_tick(runs, "m", ["dense"]) == 10 and cv.last_tick(runs, "other", ["dense"]) is None


def test_per_seed_drops_seeds_without_a_value():
    found = {"0": series({0: 0.1, 5: 0.2}), "1": series({0: float("nan")}), "2": series({7: 0.5})}
    assert cv.per_seed(found, cv.mean_over_ticks) == {"0": pytest.approx(0.15), "2": 0.5}
    assert cv.per_seed(found, lambda s: cv.value_at(s, 5)) == {"0": (5, 0.2)}  # NaN at 0; nothing <= 5
    assert cv.per_seed(found, lambda s: cv.exact_at(s, 5)) == {"0": 0.2}


def test_an_infinity_counts_as_not_logged_in_the_read_outs_as_in_the_bands():
    found = {
        "0": series({0: 0.1, 5: 0.3}),
        "1": series({0: float("inf"), 5: 0.5}),
        "2": series({5: -float("inf")}),
    }
    assert cv.per_seed(found, lambda s: cv.exact_at(s, 0)) == {"0": 0.1}
    assert cv.per_seed(found, cv.mean_over_ticks) == {"0": pytest.approx(0.2), "1": 0.5}
    assert cv.per_seed(found, cv.best) == {"0": (5, 0.3), "1": (5, 0.5)}
    assert cv.per_seed(found, cv.start_mean) == {"0": pytest.approx(0.2), "1": 0.5}
    curve = cv.aggregate(list(found.values()))
    assert curve.n.tolist() == [1, 2] and curve.mean.tolist() == pytest.approx([0.1, 0.4])


def test_last_common_tick():
    a = series({0: 0.0, 5: 0.0, 10: 0.0})
    b = series({0: 0.0, 5: 0.0})
    assert cv.last_common_tick([a, b]) == 5
    assert cv.last_common_tick([a, series({7: 0.0})]) is None
    # a NaN or an infinity is not logged: the tick every series has a value at
    assert cv.last_common_tick([a, series({0: 0.0, 5: float("nan"), 10: 1.0})]) == 10
    assert cv.last_common_tick([a, series({0: 0.0, 5: 1.0, 10: float("inf")})]) == 5


def test_known_conditions_keep_the_notes_colours_and_others_get_distinct_fallbacks():
    colours = condition_colours(["dense", "method", "anchor_off", "dropout", "prf_mask", "zeta", "alpha"])
    assert colours["dense"] == "#2ca02c" and colours["method"] == "#1f77b4"
    assert colours["anchor_off"] == "#d62728"
    assert colours["dropout"] == "#7f7f7f" and colours["prf_mask"] == "#9467bd"
    assert len({colours["zeta"], colours["alpha"], colours["dense"], colours["method"]}) == 4
    assert order_conditions(["zeta", "method", "dense", "alpha"]) == ["dense", "method", "alpha", "zeta"]
    assert np.all(np.array([len(c) for c in colours.values()]) == 7)


def rgb_distance(a: str, b: str) -> float:
    return math.dist(*([int(c[i : i + 2], 16) for i in (1, 3, 5)] for c in (a, b)))


def test_every_two_conditions_have_clearly_different_colours():
    """The 14 tiny conditions, and the whole palette, pairwise more than 60 apart in RGB (0-255 a channel);
    the note's five colours are kept."""
    assert len(CONDITION_ORDER) == 14
    colours = condition_colours(CONDITION_ORDER)
    for (a, ca), (b, cb) in itertools.combinations(colours.items(), 2):
        assert rgb_distance(ca, cb) > 60, (a, ca, b, cb)
    palette = [*CONDITION_COLOURS.values(), *FALLBACK_COLOURS]
    assert min(rgb_distance(a, b) for a, b in itertools.combinations(palette, 2)) > 60
    assert CONDITION_COLOURS == {
        "dense": "#2ca02c",
        "method": "#1f77b4",
        "anchor_off": "#d62728",
        "dropout": "#7f7f7f",
        "prf_mask": "#9467bd",
    }
