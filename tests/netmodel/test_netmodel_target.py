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


def test_evaluate_reports_seeds_that_never_reach_and_intervals_over_those_that_do():
    """Dense: two seeds reach 0.95 x 0.8 = 0.76 at step 20 (1 s compute + 1 s comm per tick, no overlap:
    40 s). The method: seed 0 at step 10 (1.1 s compute + 0.1 s comm: 12 s), seed 1 never."""
    dense_val = {"0": val((0, 0.2), (10, 0.5), (20, 0.8)), "1": val((0, 0.2), (10, 0.5), (20, 0.8))}
    method_val = {"0": val((0, 0.2), (10, 0.77), (20, 0.8)), "1": val((0, 0.2), (10, 0.3), (20, 0.4))}
    pi = PairInputs(
        pair="hand",
        source="runs",
        layout=LAYOUT,
        compressed="method",
        ticks={
            "dense": {s: ticks(20, 1e9, 1.0) for s in "01"},
            "method": {s: ticks(20, 1e8, 1.1) for s in "01"},
        },
        val={"dense": dense_val, "method": method_val},
        compute_known=True,
        compute_note="hand-built",
    )
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
    assert any("method seed(s) 1 never reach val/acc >= 0.76" in n for n in result.notes)
