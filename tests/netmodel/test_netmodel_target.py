"""Time to target on hand-built curves: reached (the sum of the modelled ticks up to the first validation at
or above the target), not reached (reported as such, left out of the interval), sparse tick logs."""

from __future__ import annotations

import numpy as np
import pytest

from commrl.netmodel import Layout, Link, NetModelError, PairInputs, Sweep, dense_target, evaluate
from commrl.netmodel.inputs import TickInputs
from commrl.netmodel.target import elapsed, first_reach, time_to_target
from commrl.report.runs import Series

LINK = Link("test", 8.0, 0.0)  # 1e9 bytes/s, no latency
LAYOUT = Layout(stages=1, dp=2, points=4)  # weights only: a ring all-reduce over 2 ranks costs W / beta


def val(*points: tuple[int, float]) -> Series:
    return Series.from_points(list(points))


def ticks(n: int, weights: float, train: float, sample: float = 0.0) -> TickInputs:
    zeros = np.zeros(n)
    return TickInputs(
        np.arange(1, n + 1),
        zeros,
        zeros,
        np.full(n, weights),
        np.full(n, train),
        np.full(n, sample),
        np.full(n, 2),
    )


def hand_built(n: int, dense_val: dict[str, Series], method_val: dict[str, Series]) -> PairInputs:
    """Two seeds of ``n`` ticks each: dense 1 s compute + 1 s of weights a tick, the method 1.1 s + 0.1 s."""
    return PairInputs(
        pair="hand",
        source="runs",
        layout=LAYOUT,
        compressed="method",
        ticks={
            "dense": {s: ticks(n, 1e9, 1.0) for s in "01"},
            "method": {s: ticks(n, 1e8, 1.1) for s in "01"},
        },
        val={"dense": dense_val, "method": method_val},
        compute_known=True,
        compute_note="hand-built",
    )


def test_reached_and_not_reached_on_a_hand_built_curve():
    """Ticks of 1 s compute and 0.5 s communication (5e8 bytes at 1e9 bytes/s): 1.5 s without overlap,
    1 s with; val/acc 0.2, 0.5, 0.7 at steps 0, 10, 20: a 0.6 target is first reached at step 20."""
    curve = val((0, 0.2), (10, 0.5), (20, 0.7))
    x = ticks(30, 5e8, 1.0)
    assert first_reach(curve, 0.6) == 20 and first_reach(curve, 0.5) == 10 and first_reach(curve, 0.1) == 0
    for overlap, per_tick in ((False, 1.5), (True, 1.0)):
        reach = time_to_target(curve, x.steps, x.tick_times(LAYOUT, LINK, overlap), 0.6)
        assert reach.reached and reach.step == 20 and reach.seconds == pytest.approx(20 * per_tick)
    assert time_to_target(curve, x.steps, x.tick_times(LAYOUT, LINK, False), 0.2).seconds == 0.0
    never = time_to_target(curve, x.steps, x.tick_times(LAYOUT, LINK, False), 0.71)
    assert not never.reached and never.step is None and never.seconds is None


def test_sparse_tick_logs_scale_by_the_logged_mean():
    steps = np.array([5, 10, 15, 20])
    assert elapsed(steps, np.array([1.0, 2.0, 3.0, 4.0]), 20) == pytest.approx(20 * 2.5)
    assert elapsed(np.arange(1, 11), np.arange(1.0, 11.0), 4) == pytest.approx(1 + 2 + 3 + 4)
    with pytest.raises(NetModelError, match="no tick logged at or before step 3"):
        elapsed(steps, np.ones(4), 3)


def test_target_is_a_fraction_of_dense_final_val_acc():
    target = dense_target({"0": val((0, 0.3), (20, 0.6)), "1": val((0, 0.3), (20, 0.8))}, 0.9)
    assert target.accuracy == pytest.approx(0.9 * 0.7) and target.seeds == 2
    with pytest.raises(NetModelError, match=r"target_fraction=0 must be in \(0, 1\]"):
        dense_target({"0": val((0, 0.5))}, 0)


def test_target_reads_dense_at_the_read_tick_and_skips_a_nan():
    """Pair A's KL runs train dense to 150 but every claim reads tick 100: so does the target. A NaN last
    validation is not logged (it once made the target NaN and every seed 'never reach')."""
    runs = {"0": val((0, 0.3), (100, 0.6), (150, 0.9)), "1": val((0, 0.3), (100, 0.8), (150, float("nan")))}
    at_read = dense_target(runs, 1.0, read_at=100)
    assert at_read.accuracy == pytest.approx(0.7) and at_read.seeds == 2
    assert "at the read tick 100" in at_read.describe()
    last = dense_target(runs, 1.0)
    assert last.accuracy == pytest.approx((0.9 + 0.8) / 2) and "at its last validation" in last.describe()
    with pytest.raises(NetModelError, match="dense has no finite val/acc"):
        dense_target({"0": val((0, float("nan")))}, 0.95)


def test_evaluate_reports_seeds_that_never_reach_and_intervals_over_those_that_do():
    """Dense: two seeds reach 0.95 x 0.8 = 0.76 at step 20 (1 s compute + 1 s comm per tick, no overlap:
    40 s). The method: seed 0 at step 10 (1.1 s compute + 0.1 s comm: 12 s), seed 1 never, so no speed-up
    to target; with seed 1 reaching it at step 20 (24 s), 40 s over their mean."""
    dense_val = {"0": val((0, 0.2), (10, 0.5), (20, 0.8)), "1": val((0, 0.2), (10, 0.5), (20, 0.8))}
    method_val = {"0": val((0, 0.2), (10, 0.77), (20, 0.8)), "1": val((0, 0.2), (10, 0.3), (20, 0.4))}
    pi = hand_built(20, dense_val, method_val)
    result = evaluate(pi, [LINK], Sweep(), 0.95)
    assert result.target.accuracy == pytest.approx(0.76)
    row = next(r for r in result.rows if not r.overlap)
    assert row.target["dense"].seconds == pytest.approx({"0": 40.0, "1": 40.0})
    assert row.target["method"].seconds == pytest.approx({"0": 12.0})
    assert row.target["method"].never == ["1"] and row.target["method"].reached_text() == "1/2"
    interval = row.target["dense"].interval()
    assert interval.estimate == pytest.approx(40.0) and interval.low == interval.high  # zero spread
    assert row.target["method"].interval().n == 1  # one seed reached it: no interval
    assert row.tick_speedup.estimate == pytest.approx(2.0 / 1.2)
    # no speed-up to target: 40 / 12 over the one method seed that reached it would read 3.3x
    assert row.target_speedup is None
    note = next(n for n in result.notes if "method seed(s) 1 never reach val/acc >= 0.76" in n)
    assert "no speed-up to target" in note
    reached = {"0": val((0, 0.2), (10, 0.77), (20, 0.8)), "1": val((0, 0.2), (10, 0.5), (20, 0.8))}
    both = next(r for r in evaluate(hand_built(20, dense_val, reached), [LINK], Sweep(), 0.95).rows)
    assert both.target_speedup.estimate == pytest.approx(40.0 / ((12.0 + 24.0) / 2))  # every seed reached


def test_seconds_interval_is_cut_at_zero_keeping_the_t_interval_above_it():
    """Two seeds at 10 s and 200 s: the t-interval 105 -+ 12.706 x 95 s reaches to -1102 s, impossible for a
    time; the cut interval is [0, the t-interval's high] about the same mean, says so in its note, and is
    no longer symmetric. Intervals that stay above 0 are the t-interval itself; from 20 seeds BCa's ends
    are bootstrap means of non-negative seconds and need no cut."""
    from commrl.netmodel.analysis import CUT_AT_ZERO, seconds_interval
    from commrl.report.stats import mean_interval

    raw, cut = mean_interval([10.0, 200.0]), seconds_interval([10.0, 200.0])
    assert raw.method == "t" and raw.low == pytest.approx(105 - 12.7062 * 95, abs=0.1) and raw.low < 0
    assert (cut.estimate, cut.low, cut.high, cut.method) == (105.0, 0.0, raw.high, "t")
    assert cut.note.startswith(CUT_AT_ZERO) and "-1102 s" in cut.note and not cut.symmetric
    assert seconds_interval([40.0, 41.0, 43.0]) == mean_interval([40.0, 41.0, 43.0])  # above 0: unchanged
    skewed = [1.0] * 19 + [1000.0, 2000.0]
    assert mean_interval(skewed).method == "bca" and seconds_interval(skewed) == mean_interval(skewed)
    assert seconds_interval([7.0]).low is None  # one seed: no interval to cut


def test_seconds_to_target_never_have_an_interval_below_zero():
    """Dense's two seeds reach the target at step 1 (2 s) and step 40 (80 s): the t-interval of their
    seconds, 41 -+ 12.706 x 39 s, would reach -455 s; the row's interval is [0, 536.5] s and the result
    notes the cut naming the condition, the link and the bound."""
    dense_val = {"0": val((0, 0.2), (1, 0.8), (40, 0.8)), "1": val((0, 0.2), (1, 0.3), (40, 0.8))}
    pi = hand_built(40, dense_val, {s: val((0, 0.2), (40, 0.8)) for s in "01"})
    result = evaluate(pi, [LINK], Sweep(), 1.0)
    for row in result.rows:
        per_tick = 1.0 if row.overlap else 2.0
        assert row.target["dense"].seconds == pytest.approx({"0": per_tick, "1": 40 * per_tick})
        interval = row.target["dense"].interval()
        mean, half = 20.5 * per_tick, 12.7062 * 19.5 * per_tick
        assert interval.estimate == pytest.approx(mean)
        assert interval.low == 0.0 and interval.high == pytest.approx(mean + half, rel=1e-4)
        # the speed-up to target, dense / method, is cut at 0 too: method reaches it at tick 40 in both seeds,
        # so Fieller's interval is dense's t-interval over method's seconds, from below 0
        method_s = row.target["method"].seconds
        assert method_s["0"] == method_s["1"]
        speedup = row.target_speedup
        assert speedup.estimate == pytest.approx(mean / method_s["0"])
        assert speedup.low == 0.0 and speedup.high == pytest.approx((mean + half) / method_s["0"], rel=1e-4)
        assert speedup.note.startswith("cut at 0, a ratio of non-negative quantities")
    note = next(n for n in result.notes if "cut at 0 s" in n)
    assert "cut at 0 s" in note and "dense seconds to target at test (both bounds)" in note
    assert "method seconds to target" not in note  # 40 ticks in every seed: zero spread
