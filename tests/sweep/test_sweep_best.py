"""The one rule that picks a study's best trial (the sweep's summary and the report's Sweeps table)."""

from __future__ import annotations

from commrl.sweep.best import best_trial, tied_with

# (number, value) in the order the trials started: trial 3 (a retry's order) started before trial 1
TRIALS = [(0, 0.5), (3, 0.7), (1, 0.7), (2, None)]


def value(t):
    return t[1]


def number(t):
    return t[0]


def test_a_tie_goes_to_the_lowest_number_not_the_first_started():
    best = best_trial(TRIALS, value, number)
    assert best == (1, 0.7)
    assert tied_with(TRIALS, best, value) == [(3, 0.7)]


def test_minimize_and_no_value():
    assert best_trial(TRIALS, value, number, "minimize") == (0, 0.5)
    assert best_trial([(0, None)], value, number) is None
    assert tied_with(TRIALS, (0, 0.5), value) == []
