"""Figure 14, the async table and claims 13-15 on in-memory pairs (``PairRuns`` of synthetic seeds).

Pairs are read at tick 40 with validation reads at 0, 10, 20, 30, 40 (the tiny pair's), three seeds unless a
case needs fewer; each case sets the per-seed values its verdict turns on.
"""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure

from commrl.report import ClaimThresholds, evaluate_claims, stats
from commrl.report import figures as fg
from commrl.report.runs import TRAIN_METRICS, PairRuns, Series, TrainRun
from commrl.report.style import ASYNC_CONDITIONS, condition_colours
from commrl.report.tables import async_table

READ_AT = 40
VAL_TICKS = (0, 10, 20, 30, 40)
TICKS = tuple(range(41))
BASE = 0.40


def val(final: float) -> Series:
    """val/acc from BASE at tick 0 rising linearly to ``final`` at the read tick."""
    return Series.from_points([(t, BASE + (final - BASE) * t / READ_AT) for t in VAL_TICKS])


def flat(value: float) -> Series:
    return Series.from_points([(t, value) for t in TICKS])


def pair(spec: dict[str, list[tuple[float, float]]], name: str = "T") -> PairRuns:
    """``condition -> [(val at the read, effective token frac) per seed]``; seed i is ``str(i)``. A dense
    run with every metric is added, so that a figure or table that drew every condition would show it."""
    spec = {"dense": [(0.9, 1.0)] * 3, **spec}
    train = []
    for condition, seeds in spec.items():
        for i, (final, frac) in enumerate(seeds):
            metrics = {
                "val/acc": val(final),
                "actor/effective_token_frac": flat(frac),
                "rollout_corr/kl": flat(0.5 if "method" in condition else 0.01),
            }
            train.append(
                TrainRun(
                    f"{condition}-{i}", condition, condition, "", str(i), "FINISHED", READ_AT, 40, metrics
                )
            )
    return PairRuns(name, train, [], [])


def spread(mean: float, width: float = 0.002, n: int = 3) -> list[float]:
    """``n`` values centred on ``mean``, ``width`` apart."""
    return [mean + width * (i - (n - 1) / 2) for i in range(n)]


def seeds(finals: list[float], frac: float = 0.9) -> list[tuple[float, float]]:
    return [(f, frac + 0.01 * i) for i, f in enumerate(finals)]


HEALTHY = {
    "dense_async": seeds(spread(0.70)),
    "method_async": seeds(spread(0.45), frac=0.15),
    "method_async_tis": seeds(spread(0.55)),  # dense_async - tis = 0.15: MISS
    "method_async_icepop": seeds(spread(0.68, 0.004)),  # 0.02, spread: PASS
    "method_async_seq_rs": seeds(spread(0.50)),  # 0.20: MISS
    "dense_async_tis": seeds(spread(0.705)),  # +0.005 in every seed: PASS
}


def claims(runs: PairRuns, **overrides: float) -> dict[int, object]:
    return {c.number: c for c in evaluate_claims(runs, ClaimThresholds.with_overrides(overrides))}


def test_rollout_corr_and_effective_token_frac_are_read_from_mlflow():
    """The report reads every metric the local driver logs for the async conditions (its names live in
    commrl.rl.correction)."""
    from commrl.rl.correction import LOGGED_METRICS

    assert set(LOGGED_METRICS) <= set(TRAIN_METRICS)
    assert "actor/effective_token_frac" in TRAIN_METRICS


def test_claim_13_passes_when_method_async_starves_and_misses_when_it_does_not():
    starves = claims(pair(HEALTHY))[13]
    assert starves.status == "PASS"
    assert starves.checks[0].interval.estimate == pytest.approx(0.16)  # 0.15, 0.16, 0.17
    assert (
        starves.checks[1].interval.estimate == pytest.approx(0.05 - 0.30)
        and starves.checks[1].interval.paired
    )
    assert "method_async effective token frac (fast ticks): 95% CI" in starves.reason
    assert "val gain method_async - dense_async: 95% CI" in starves.reason

    keeps_tokens = claims(pair({**HEALTHY, "method_async": seeds(spread(0.45), frac=0.6)}))[13]
    assert (
        keeps_tokens.status == "MISS"
        and keeps_tokens.decided_by.quantity == "method_async effective token frac (fast ticks)"
    )
    learns = claims(pair({**HEALTHY, "method_async": seeds(spread(0.75), frac=0.15)}))[13]
    assert learns.status == "MISS" and learns.decided_by.quantity == "val gain method_async - dense_async"
    assert learns.checks[0].status == "PASS"  # the fraction alone would pass
    assert claims(pair(HEALTHY), async_method_max_effective_frac=0.1)[13].status == "MISS"


def test_claim_14_names_the_correction_that_closes_the_gap():
    closes = claims(pair(HEALTHY))[14]
    assert closes.status == "PASS" and closes.combine == "any"
    assert closes.reason.startswith("passing: val dense_async - method_async_icepop;")
    assert "method_async_tis" in closes.reason and "method_async_seq_rs" in closes.reason
    assert closes.values["passing"] == "method_async_icepop"
    assert closes.decided_by.quantity == "val dense_async - method_async_icepop"
    assert closes.interval.estimate == pytest.approx(0.02) and closes.interval.high <= 0.05
    assert closes.threshold.startswith("val dense_async - corrected at read <= 0.05 for any of")
    # three alternatives: each interval at 1 - 0.05/3 (Bonferroni), wider than one 95% interval
    assert [c.interval.confidence for c in closes.checks] == pytest.approx([1 - 0.05 / 3] * 3)
    assert "method_async_icepop: 98.3% CI" in closes.reason
    assert "method_async_icepop 0.680 ± " in closes.value and "(98.3%, n=3)" in closes.value
    by_seed = [{str(i): v for i, v in enumerate(spread(m, w))} for m, w in ((0.70, 0.002), (0.68, 0.004))]
    at_95 = stats.difference_interval(*by_seed)
    assert closes.interval.low < at_95.low and closes.interval.high > at_95.high

    none_close = claims(pair({**HEALTHY, "method_async_icepop": seeds(spread(0.50))}))[14]
    assert none_close.status == "MISS" and none_close.reason.startswith("passing: none;")
    assert none_close.values["passing"] == "none"

    straddles = {**HEALTHY, "method_async_icepop": seeds([0.60, 0.66, 0.72])}  # gap 0.04 +- 0.15
    unsure = claims(pair(straddles))[14]
    assert unsure.status == "INCONCLUSIVE" and unsure.reason.startswith("passing: none;")
    assert unsure.decided_by.quantity == "val dense_async - method_async_icepop"
    assert claims(pair(HEALTHY), async_correction_max_val_gap=0.01)[14].status == "MISS"


def test_claim_14_evaluates_the_corrections_run_and_is_na_without_them():
    only_tis = {k: v for k, v in HEALTHY.items() if k not in ("method_async_icepop", "method_async_seq_rs")}
    partial = claims(pair(only_tis))[14]
    assert partial.status == "MISS" and len(partial.checks) == 1
    assert "not run: method_async_icepop, method_async_seq_rs" in partial.value
    assert partial.reason.startswith("passing: none; val dense_async - method_async_tis: 95% CI")

    no_corrections = {k: v for k, v in HEALTHY.items() if k in ("dense_async", "method_async")}
    na = claims(pair(no_corrections))[14]
    assert na.status == "n/a" and na.reason == "inputs missing" and not na.checks
    assert na.value == "no method_async_tis, method_async_icepop or method_async_seq_rs runs with val/acc"
    no_dense = claims(pair({k: v for k, v in HEALTHY.items() if k != "dense_async"}))
    assert no_dense[14].status == "n/a" and no_dense[14].value == "no dense_async runs with val/acc"
    assert no_dense[13].status == "n/a" and no_dense[15].status == "n/a"
    assert all(claims(pair({}))[n].status == "n/a" for n in (13, 14, 15))


def test_claim_15_passes_inside_the_band_and_is_inconclusive_when_the_interval_straddles_it():
    same = claims(pair(HEALTHY))[15]
    assert same.status == "PASS" and same.interval.estimate == pytest.approx(0.005)
    assert "inside ±0.05" in same.reason
    noisy = {**HEALTHY, "dense_async_tis": seeds([0.66, 0.74, 0.72])}  # diffs -0.04, +0.04, +0.02
    unsure = claims(pair(noisy))[15]
    assert unsure.status == "INCONCLUSIVE" and "straddles ±0.05" in unsure.reason
    assert unsure.interval.low < -0.05 < unsure.interval.high
    costs = claims(pair({**HEALTHY, "dense_async_tis": seeds(spread(0.60))}))[15]
    assert costs.status == "MISS" and costs.interval.high < -0.05


def capture_figure(monkeypatch) -> list[Figure]:
    saved: list[Figure] = []
    monkeypatch.setattr(fg, "_save", lambda fig, path: saved.append(fig))
    return saved


def test_figure_14_has_a_val_and_a_token_panel_with_a_banded_line_per_async_condition(monkeypatch, tmp_path):
    runs = pair(HEALTHY)
    saved = capture_figure(monkeypatch)
    result = fg.async_figure(runs, condition_colours(runs.conditions()), tmp_path)
    assert result.drawn and result.file == "fig14_async_T.png" and result.number == 14
    assert not result.notes and "Seeds: dense_async n=3" in result.caption
    (fig,) = saved
    val_ax, frac_ax = fig.axes
    assert val_ax.get_title() == "validation accuracy per read"
    assert frac_ax.get_title() == "tokens carrying gradient (fast ticks)"
    expected = [f"{c} (n=3)" for c in ASYNC_CONDITIONS] + [f"read at tick {READ_AT}"]
    for ax in (val_ax, frac_ax):
        assert ax.get_legend_handles_labels()[1] == expected  # dense is in the pair, not in the figure
        assert len(ax.collections) == len(ASYNC_CONDITIONS)  # a band per condition
    assert val_ax.lines[0].get_marker() == "o" and frac_ax.lines[0].get_marker() in (None, "None")
    method_line = frac_ax.lines[ASYNC_CONDITIONS.index("method_async")]
    assert method_line.get_ydata() == pytest.approx([0.16] * len(TICKS))


def test_figure_14_is_written_skips_absent_conditions_and_says_why_when_all_are_absent(tmp_path):
    partial = {k: v for k, v in HEALTHY.items() if k in ("dense_async", "method_async")}
    runs = pair(partial)
    drawn = fg.async_figure(runs, condition_colours(runs.conditions()), tmp_path)
    assert drawn.drawn and (tmp_path / drawn.file).stat().st_size > 10_000
    assert drawn.notes == (
        "Figure 14 (T): no runs with val/acc or actor/effective_token_frac for method_async_tis, "
        "method_async_icepop, method_async_seq_rs, dense_async_tis; drawn without them",
    )
    none = pair({}, name="U")
    skipped = fg.async_figure(none, condition_colours(none.conditions()), tmp_path)
    assert not skipped.drawn and not (tmp_path / skipped.file).exists()
    assert skipped.notes[0].startswith(
        "Figure 14 skipped (U): no runs with val/acc or actor/effective_token_frac"
    )


def test_async_table_holds_the_async_conditions_only_with_seed_intervals():
    table = async_table(pair(HEALTHY))
    rows = {r[0]: dict(zip(table.columns, r, strict=True)) for r in table.rows}
    assert list(rows) == list(ASYNC_CONDITIONS)
    method = rows["method_async"]
    assert method["seeds"] == 3 and method["read tick"] == READ_AT
    assert method["val at read"].estimate == pytest.approx(0.45) and method["val at read"].n == 3
    assert method["val gain"].estimate == pytest.approx(0.05)
    frac = method["effective token frac"]
    assert frac.estimate == pytest.approx(0.16) and frac.low < 0.16 < frac.high
    assert method["k3 kl"] is None  # not logged here
    assert "IS eff sample size" not in table.columns  # no run logged it
    assert async_table(pair({})) is None


def test_the_effective_token_fraction_is_read_on_fast_ticks_only():
    """A fire's ratio-one replay carries every token; the report drops those ticks (``runs.fast_ticks``)."""
    from commrl.report.runs import Series, fast_ticks

    frac = Series(np.arange(1, 7), np.array([1.0, 0.3, 1.0, 0.4, 1.0, 0.5]))
    fire = Series(np.arange(1, 7), np.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.0]))
    fast = fast_ticks(frac, fire)
    assert fast.steps.tolist() == [2, 4, 6]
    assert fast.values.tolist() == [0.3, 0.4, 0.5]
    never = fast_ticks(frac, Series(np.arange(1, 7), np.zeros(6)))  # dense: every tick is a fast tick
    assert never.values.tolist() == frac.values.tolist()
