"""``commrl.report.stats``: intervals over seeds on known distributions, the small-n cases, the verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commrl.report import stats as st
from commrl.report.style import format_interval

REPS = 200


def seeds(values) -> dict[str, float]:
    """``seed -> value``, seeds named 0, 1, ... (two conditions built this way are paired)."""
    return {str(i): float(v) for i, v in enumerate(values)}


def covers(interval: st.Interval, truth: float) -> bool:
    return interval.low <= truth <= interval.high


def test_t_interval_of_five_normal_seeds_covers_the_mean_about_95_percent():
    rng = np.random.default_rng(1)
    hits = [covers(st.mean_interval(rng.normal(3.0, 2.0, size=5)), 3.0) for _ in range(REPS)]
    assert 0.90 <= np.mean(hits) <= 0.99
    assert st.mean_interval(rng.normal(size=5)).method == "t"


def test_bca_from_twenty_seeds_covers_the_mean_and_is_deterministic():
    """Twenty seeds is where the bootstrap starts; 200 samples in one vectorised call (``mean_bands``)."""
    rng = np.random.default_rng(2)
    samples = rng.normal(0.5, 0.1, size=(st.MIN_BOOTSTRAP_N, REPS))  # seeds x repetitions
    bands = st.mean_bands(samples)
    coverage = np.mean((bands.low <= 0.5) & (bands.high >= 0.5))
    assert 0.88 <= coverage <= 0.99
    one = st.mean_interval(samples[:, 0])
    assert one.method == "bca" and not one.symmetric
    assert st.mean_interval(samples[:, 0]) == one  # a fixed rng: the same inputs give the same interval
    assert (one.low, one.high) == pytest.approx((bands.low[0], bands.high[0]))


def test_median_interval_is_the_binomial_order_statistics_and_covers_a_skewed_median():
    """A benchmark's median: for 20 repetitions the 6th and 15th values (coverage 95.9%), for 9 the 2nd and
    8th (96.1%); on a log-normal (skewed, as timings are) it covers the true median about that often."""
    twenty = st.median_interval(np.arange(20.0)[::-1])
    assert (twenty.estimate, twenty.low, twenty.high, twenty.method) == (9.5, 5.0, 14.0, "order")
    assert twenty.note == "order statistics 6 and 15 of 20: coverage 95.9%"
    nine = st.median_interval(np.arange(9.0))
    assert (nine.low, nine.high) == (1.0, 7.0) and "96.1%" in nine.note
    rng = np.random.default_rng(3)
    samples = rng.lognormal(0.0, 0.5, size=(2000, 20))  # true median exp(0) = 1
    hits = [covers(st.median_interval(row), 1.0) for row in samples]
    assert 0.945 <= np.mean(hits) <= 0.975


def test_median_interval_below_six_repetitions_has_none_and_bad_values_are_refused():
    five = st.median_interval([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (five.estimate, five.low, five.high, five.method) == (3.0, None, None, "none")
    assert five.note == "n=5: a median's 95% interval needs 6"
    six = st.median_interval([3.0, 1.0, 2.0, 5.0, 4.0, 6.0])
    assert (six.low, six.high) == (1.0, 6.0) and "96.9%" in six.note
    with pytest.raises(ValueError, match="median_interval: non-finite"):
        st.median_interval([1.0, float("inf")])


def test_paired_difference_covers_and_is_narrower_than_unpaired_when_seeds_share_noise():
    rng = np.random.default_rng(3)
    hits, paired_wider = [], 0
    for _ in range(REPS):
        shared = rng.normal(0, 1.0, size=5)  # what one seed does to both conditions
        a = 0.7 + shared + rng.normal(0, 0.05, size=5)
        b = 0.6 + shared + rng.normal(0, 0.05, size=5)
        paired = st.difference_interval(seeds(a), seeds(b))
        unpaired = st.difference_interval(seeds(a), {f"other{i}": v for i, v in enumerate(b)})
        assert paired.paired and not unpaired.paired and unpaired.method == "welch"
        hits.append(covers(paired, 0.1))
        paired_wider += paired.half_width > unpaired.half_width
    assert 0.90 <= np.mean(hits) <= 0.99
    assert paired_wider == 0


def test_welch_interval_of_unpaired_conditions_covers_the_difference():
    rng = np.random.default_rng(4)
    hits = []
    for _ in range(REPS):
        a, b = rng.normal(1.0, 0.2, size=4), rng.normal(0.5, 0.6, size=6)
        hits.append(covers(st.difference_interval(seeds(a), {f"b{i}": v for i, v in enumerate(b)}), 0.5))
    assert 0.90 <= np.mean(hits) <= 0.99


def test_scaled_difference_is_a_minus_c_times_b():
    a, b = seeds([1.0, 2.0, 3.0]), seeds([2.0, 2.0, 2.0])
    contrast = st.difference_interval(a, b, scale=0.5)
    assert contrast.estimate == pytest.approx(1.0)
    assert contrast.half_width == pytest.approx(st.mean_interval([0.0, 1.0, 2.0]).half_width)


@pytest.mark.parametrize("paired", [True, False])
def test_fieller_ratio_covers_the_ratio_of_means(paired):
    rng = np.random.default_rng(5)
    hits = []
    for _ in range(REPS):
        a, b = rng.normal(10.0, 1.0, size=5), rng.normal(2.0, 0.2, size=5)
        other = seeds(b) if paired else {f"b{i}": v for i, v in enumerate(b)}
        ratio = st.ratio_interval(seeds(a), other)
        assert ratio.method == "fieller" and ratio.paired is paired
        hits.append(covers(ratio, 5.0))
    assert 0.90 <= np.mean(hits) <= 0.99


def test_ratio_edge_cases():
    unbounded = st.ratio_interval(seeds([10, 11, 9]), seeds([1.0, -1.0, 0.1]))
    assert (unbounded.low, unbounded.high) == (-math.inf, math.inf) and "unbounded" in unbounded.note
    zero = st.ratio_interval(seeds([10, 11, 9]), seeds([0, 0, 0]))
    assert zero.estimate == zero.low == zero.high == math.inf and "0 in every seed" in zero.note
    exact = st.ratio_interval(seeds([4.0, 4.0]), seeds([2.0, 2.0]))
    assert exact.low == pytest.approx(2.0) and exact.high == pytest.approx(2.0)
    mean_zero = st.ratio_interval(seeds([1.0, 2.0, 3.0]), {"a": -1.0, "b": 0.0, "c": 1.0})  # unpaired
    assert (mean_zero.low, mean_zero.high) == (-math.inf, math.inf) and "mean is 0" in mean_zero.note
    one = st.ratio_interval(seeds([4.0]), seeds([2.0]))
    assert one.estimate == 2.0 and one.low is None and one.note == "n=1: no interval"


def test_a_ratio_of_non_negative_quantities_is_cut_at_zero():
    """KL of a method run 0.1, 0.5, 2.2 nats against dense's 0.03-0.04: Fieller's interval reaches -58.7,
    a value a ratio of two KLs cannot take; ``nonnegative`` cuts it at 0 with a note naming the lower end it
    replaced, and an unbounded interval reads ``[0, inf]``. A bounded interval above 0 is left as it is."""
    a, b = seeds([0.1, 0.5, 2.2]), seeds([0.03, 0.04, 0.035])
    raw, cut = st.ratio_interval(a, b), st.ratio_interval(a, b, nonnegative=True)
    assert raw.low == pytest.approx(-58.708, abs=1e-3)
    assert (cut.estimate, cut.low, cut.high, cut.method) == (raw.estimate, 0.0, raw.high, "fieller")
    assert "cut at 0" in cut.note and "-58.71" in cut.note
    assert format_interval(cut, ".3g") == "26.7 [0, 108] (n=3)"
    unbounded = st.ratio_interval(seeds([0.0, 0.5, 0.02]), seeds([0.05, 1.5, 1.3]), nonnegative=True)
    assert (unbounded.low, unbounded.high) == (0.0, math.inf) and "unbounded" in unbounded.note
    away = seeds([10, 11, 9]), seeds([2.0, 2.1, 1.9])
    assert st.ratio_interval(*away, nonnegative=True) == st.ratio_interval(*away)


def test_a_non_negative_ratio_over_a_noisy_denominator_near_zero_is_bounded_below():
    """The note's KL regime: method ~7 nats, dense 0.001-0.02. The denominator's interval holds 0, so the
    set is two rays, ``(-inf, -428.5]`` and ``[217.3, inf)``; a ratio of KLs takes the second, and the claim
    "at least 10x" passes, as the t-test of the contrast ``method - 10 dense`` does (it read ``[0, inf]``,
    INCONCLUSIVE, however large the gap)."""
    method, dense = seeds([6.5, 7.1, 7.7]), seeds([0.001, 0.02, 0.006])
    ratio = st.ratio_interval(method, dense, nonnegative=True)
    assert ratio.low == pytest.approx(217.30, abs=0.01) and ratio.high == math.inf
    assert "-428.5" in ratio.note and "[217.3, inf)" in ratio.note
    assert st.verdict(ratio, "at_least", 10.0)[0] == st.PASS
    for rho, inside in ((217.2, False), (217.4, True), (5000.0, True)):  # the set: rho a t-test keeps
        contrast = st.difference_interval(method, dense, scale=rho)
        assert (contrast.low <= 0 <= contrast.high) is inside
    assert (st.ratio_interval(method, dense).low, st.ratio_interval(method, dense).high) == (
        -math.inf,
        math.inf,
    )


def test_a_verdicts_reason_never_prints_a_bound_as_its_threshold():
    """A lower end of 0.049996 against >= 0.05 straddles it; printed to 4 digits it would read 0.05, as if
    it passed. The reason prints as many digits as it takes; other bounds keep 4."""
    interval = st.Interval(0.1, 0.049996, 0.2, (3,), "t")
    status, reason = st.verdict(interval, "at_least", 0.05)
    assert status == st.INCONCLUSIVE and reason == "95% CI [0.049996, 0.2] straddles 0.05"
    status, reason = st.verdict(st.Interval(0.0, -0.0500001, 0.04, (3,), "t"), "within", 0.05)
    assert reason == "95% CI [-0.0500001, 0.04] straddles ±0.05"
    assert st.verdict(st.Interval(0.1, 0.0612345, 0.2, (3,), "t"), "at_least", 0.05)[1].startswith(
        "95% CI [0.06123, 0.2]"
    )


def test_one_seed_two_seeds_and_zero_spread():
    one = st.mean_interval([0.42])
    assert (one.estimate, one.low, one.high, one.n, one.method) == (0.42, None, None, 1, "none")
    assert one.note == "n=1: no interval" and one.half_width is None
    two = st.mean_interval([0.0, 2.0])  # s = sqrt(2), se = 1, t(1, 0.975) = 12.706
    assert two.method == "t" and two.low == pytest.approx(1 - 12.7062, abs=1e-3)
    assert two.high == pytest.approx(1 + 12.7062, abs=1e-3)
    flat = st.mean_interval([0.3, 0.3, 0.3])
    assert flat.low == flat.high == pytest.approx(0.3) and "zero spread" in flat.note
    flat_many = st.mean_interval([0.3] * 25)  # BCa is undefined there: not called
    assert flat_many.low == flat_many.high == pytest.approx(0.3)
    short = st.difference_interval(seeds([1.0, 2.0, 3.0]), {"x": 1.0})
    assert short.low is None and short.sizes == (3, 1) and "no interval" in short.note


def test_bad_values_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="no values"):
        st.mean_interval([])
    with pytest.raises(ValueError, match=r"non-finite.*drop the seeds"):
        st.mean_interval([0.1, float("nan")])


def test_mean_bands_per_column_over_the_seeds_that_logged_it():
    table = np.array([[1.0, 2.0, np.nan, 4.0], [2.0, 3.0, 5.0, np.nan], [3.0, 4.0, np.nan, np.nan]])
    bands = st.mean_bands(table)
    assert bands.mean.tolist() == [2.0, 3.0, 5.0, 4.0] and bands.n.tolist() == [3, 3, 1, 1]
    ref = st.mean_interval([1.0, 2.0, 3.0])
    assert (bands.low[0], bands.high[0]) == pytest.approx((ref.low, ref.high))
    assert np.isnan(bands.low[2:]).all() and np.isnan(bands.high[2:]).all()


@pytest.mark.parametrize(
    ("values", "side", "threshold", "status"),
    [
        ([0.30, 0.31, 0.32], "at_least", 0.05, st.PASS),  # clear pass
        ([0.01, 0.02, 0.03], "at_least", 0.05, st.MISS),  # clear miss
        ([0.00, 0.05, 0.10], "at_least", 0.05, st.INCONCLUSIVE),  # straddles
        ([0.30], "at_least", 0.05, st.INCONCLUSIVE),  # one seed, however far
        ([0.020, 0.021, 0.022], "above", 0.0, st.PASS),
        ([-0.020, -0.021, -0.022], "above", 0.0, st.MISS),
        ([-0.01, 0.0, 0.01], "above", 0.0, st.INCONCLUSIVE),
        ([0.10, 0.11, 0.12], "at_most", 0.9, st.PASS),
        ([0.95, 0.96, 0.97], "at_most", 0.9, st.MISS),
        ([-0.020, -0.021, -0.022], "below", 0.0, st.PASS),
        ([0.020, 0.021, 0.022], "below", 0.0, st.MISS),
        ([-0.01, 0.0, 0.01], "below", 0.0, st.INCONCLUSIVE),
        ([0.00, 0.01, -0.01], "within", 0.05, st.PASS),
        ([-0.24, -0.25, -0.23], "within", 0.05, st.MISS),
        ([0.03, 0.05, 0.07], "within", 0.05, st.INCONCLUSIVE),
        ([0.0], "within", 0.05, st.INCONCLUSIVE),
    ],
)
def test_verdict_is_three_way_on_the_interval(values, side, threshold, status):
    got, reason = st.verdict(st.mean_interval(values), side, threshold)
    assert got == status
    assert reason == "n=1: no interval" if len(values) == 1 else reason.startswith("95% CI [")


def test_verdict_on_a_point_interval_at_the_threshold_and_unknown_side_fails():
    """At the threshold with no spread (every seed tied): ``x >= t`` passes, ``x > t`` misses."""
    assert st.verdict(st.mean_interval([0.05, 0.05]), "at_least", 0.05)[0] == st.PASS
    assert st.verdict(st.mean_interval([0.0, 0.0, 0.0]), "above", 0.0) == (st.MISS, "95% CI [0, 0] <= 0")
    # "gains less than" (claim 13) on a tie: no gain in either condition is not less, as <= 0 passed it
    assert st.verdict(st.mean_interval([0.0, 0.0, 0.0]), "below", 0.0) == (st.MISS, "95% CI [0, 0] >= 0")
    assert st.verdict(st.mean_interval([0.0, 0.0, 0.0]), "at_most", 0.0)[0] == st.PASS
    with pytest.raises(ValueError, match="side 'beyond'"):
        st.verdict(st.mean_interval([1.0, 2.0]), "beyond", 0.0)


def test_interval_text():
    assert format_interval(st.Interval(0.654, 0.633, 0.675, (3,), "t")) == "0.654 ± 0.021 (n=3)"
    assert format_interval(st.mean_interval([0.654])) == "0.654 (n=1)"
    assert format_interval(st.Interval(100.0, 60.2, 166.0, (3,), "fieller")) == "100 [60.2, 166] (n=3)"
    assert (
        format_interval(st.Interval(0.743, 0.722, 0.764, (3, 2), "welch"), ".1%") == "74.3% ± 2.1% (n=3 vs 2)"
    )
    bonferroni = st.Interval(0.126, -0.195, 0.447, (3,), "t", confidence=1 - 0.05 / 3)
    assert format_interval(bonferroni, ".3g") == "0.126 ± 0.32 (98.3%, n=3)"
