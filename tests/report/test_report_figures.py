"""The curve and bar figures on an in-memory pair (``PairRuns`` of synthetic seeds): what each draws and what
its caption says. Pair ``P`` is read at tick 100 and validated every 25 ticks; dense and method run on to
tick 150, as pair A's KL runs do."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure

from commrl import tracking
from commrl.report import figures as fg
from commrl.report.runs import FAST_TICK_METRICS, PairRuns, Series, TrainRun, load_pair, on_fast_ticks
from commrl.report.style import condition_colours

READ_AT, LAST = 100, 150
SEEDS = ("0", "1", "2")
TICKS = np.arange(LAST + 1)
VAL_TICKS = np.arange(0, LAST + 1, 25)
METHOD_VAL = {0: 0.40, 25: 0.5, 50: 0.55, 75: 0.6, 100: 0.62, 125: 0.90, 150: 0.30}


def flat(value: float, ticks: np.ndarray = TICKS) -> Series:
    return Series(ticks, np.full(len(ticks), value))


def metrics(condition: str, seed: str, corrected_shift: float) -> dict[str, Series]:
    """Every metric a curve figure reads, at every tick to 150; seed ``k`` moves each by ``0.01 k``."""
    d = 0.01 * int(seed)
    val = METHOD_VAL if condition == "method" else dict.fromkeys(VAL_TICKS.tolist(), 0.5)
    raw = Series(VAL_TICKS, np.full(len(VAL_TICKS), 0.1 + d))
    out = {
        "score/mean": Series(TICKS, 0.3 + 0.002 * TICKS + d),
        "val/acc": Series.from_points([(t, v + d) for t, v in val.items()]),
        "actor/kl_loss": Series(TICKS, 0.01 * TICKS + d),
        "mismatch/logprob_corr": flat(0.2 + d),
        "mismatch/prob_gap": flat(0.001 * (1 + int(seed))),  # mean 0.002, its t band's lower end < 0
        "mismatch/async_clip_frac_eps0.2": flat(0.7 + d),
        "mismatch/async_clip_frac_5x": flat(0.6 + d),
        "actor/pg_clipfrac": flat(0.05 + d),
        "actor/ppo_kl": flat(0.02 + d),
    }
    if condition == "method":
        out["anchor/grad_cosine_raw"] = raw
        out["anchor/grad_cosine_corrected"] = Series(raw.steps, raw.values + corrected_shift)
        out["sign_memory/agreement"] = flat(0.5 + d)
    return out


def pair(corrected_shift: float = 0.0) -> PairRuns:
    """dense and method, three seeds each, read at tick 100, logged to tick 150."""
    train = [
        TrainRun(f"{c}-{s}", c, c, "identity" if c == "dense" else "lowrank", s, "FINISHED", READ_AT, LAST,
                 metrics(c, s, corrected_shift))
        for c in ("dense", "method")
        for s in SEEDS
    ]  # fmt: skip
    return PairRuns("P", train, [], [])


def draw(monkeypatch, tmp_path, figure: fg.FigureFn, runs: PairRuns) -> tuple[fg.FigureResult, Figure]:
    saved: list[Figure] = []
    monkeypatch.setattr(fg, "_save", lambda fig, path: saved.append(fig))
    result = figure(runs, condition_colours(runs.conditions()), tmp_path)
    (fig,) = saved
    return result, fig


def last_drawn_tick(fig: Figure) -> float:
    """The last tick of any condition's line (the dotted read-tick line left out)."""
    lines = [line for ax in fig.axes for line in ax.lines if line.get_linestyle() != ":"]
    return max(float(np.max(line.get_xdata())) for line in lines)


@pytest.mark.parametrize(
    "figure",
    [
        fg.score_figure,
        fg.validation_figure,
        fg.mismatch_figure,
        fg.async_clip_figure,
        fg.clip_figure,
        fg.diagnostics_figure,
    ],
)
def test_curve_figures_are_drawn_up_to_the_read_tick(monkeypatch, tmp_path, figure):
    result, fig = draw(monkeypatch, tmp_path, figure, pair())
    assert last_drawn_tick(fig) == READ_AT
    cut = f"Drawn up to the read tick (tick {READ_AT}, dotted); the ticks logged after it (to tick {LAST})"
    assert f"{cut} are not drawn." in result.caption


def test_the_kl_figure_draws_the_whole_run_and_says_it_goes_past_the_read_tick(monkeypatch, tmp_path):
    result, fig = draw(monkeypatch, tmp_path, fg.kl_figure, pair())
    assert last_drawn_tick(fig) == LAST
    whole = f"Every run is drawn to its last logged tick (up to tick {LAST}), past the read tick"
    assert f"{whole} (tick {READ_AT}, dotted)" in result.caption
    assert "Drawn up to" not in result.caption


def test_window_caption():
    assert fg.window_caption(None, LAST, whole_run=False) == ""
    assert fg.window_caption(READ_AT, READ_AT, whole_run=True) == ""  # nothing past the read tick
    only_read = fg.window_caption(READ_AT, READ_AT, whole_run=False)
    assert only_read == "Drawn up to the read tick (tick 100, dotted)."


def test_the_diagnostics_figure_says_when_no_sign_correction_acted(monkeypatch, tmp_path):
    """alpha = 1: the corrected cosine is the raw one in every run, and the caption says the two panels are
    the same; its sign-agreement statement holds for every alpha."""
    same, fig = draw(monkeypatch, tmp_path, fg.diagnostics_figure, pair())
    assert "No sign correction in these runs" in same.caption
    assert "the two cosine panels are the same" in same.caption
    raw, corrected = fig.axes[0], fig.axes[1]
    assert corrected.get_title() == "cosine, after sign correction"  # the panel is kept
    assert np.array_equal(raw.lines[0].get_ydata(), corrected.lines[0].get_ydata())  # method; dense has none
    assert "1 by construction for alpha <= 0.5" in same.caption and "alpha < 0.5)" not in same.caption
    corrected_runs, _ = draw(monkeypatch, tmp_path, fg.diagnostics_figure, pair(corrected_shift=0.05))
    assert "No sign correction" not in corrected_runs.caption


def test_uncorrected_needs_a_run_with_both_cosines():
    assert fg.uncorrected(pair(), READ_AT) and not fg.uncorrected(pair(0.05), READ_AT)
    assert not fg.uncorrected(PairRuns("E", [], [], []), READ_AT)


def test_figure_7_takes_each_seeds_best_over_the_whole_run(monkeypatch, tmp_path):
    """The method's best is 0.90 at tick 125, after the read tick (0.62 at it): the note's Figure 7 reads it
    there; the caption says so and that the table and claim 11 read up to the read tick."""
    result, fig = draw(monkeypatch, tmp_path, fg.best_validation_figure, pair())
    (ax,) = fig.axes
    heights = [bar.get_height() for bar in ax.patches]
    assert heights == pytest.approx([0.51, 0.91])  # dense 0.5 + 0.01 k; method 0.90 + 0.01 k at tick 125
    labels = [t.get_text() for t in ax.texts]
    assert labels[1].endswith("@ ticks 125, 125, 125")
    assert labels[0].endswith("@ ticks 0, 0, 0\n(0 = base)")  # dense is flat: its best is the base read
    assert "over its whole run" in result.caption
    assert f"reads the best up to the read tick (tick {READ_AT}) instead, and claim 11 the val/acc at it" in (
        result.caption
    )


def test_ticks_label_lists_every_seeds_tick_and_marks_the_base_model():
    assert fg.ticks_label([40]) == "@ tick 40"
    assert fg.ticks_label([40, 0, 0]) == "@ ticks 0, 0, 40\n(0 = base)"
    assert fg.ticks_label([30, 40, 40]) == "@ ticks 30, 40, 40"


def test_pg_clipfrac_and_ppo_kl_are_read_on_fast_ticks_only():
    """A fire tick's ratio-one dense replay clips nothing: pg_clipfrac and ppo_kl are 0 there."""
    fire = Series(np.arange(1, 7), np.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.0]))
    clip = Series(np.arange(1, 7), np.array([0.0, 0.3, 0.0, 0.4, 0.0, 0.5]))
    logged = {"actor/pg_clipfrac": clip, "actor/ppo_kl": clip, "score/mean": clip}
    fast = on_fast_ticks(logged, fire)
    assert set(FAST_TICK_METRICS) >= {"actor/pg_clipfrac", "actor/ppo_kl", "actor/effective_token_frac"}
    for key in ("actor/pg_clipfrac", "actor/ppo_kl"):
        assert fast[key].steps.tolist() == [2, 4, 6] and fast[key].values.tolist() == [0.3, 0.4, 0.5]
    assert fast["score/mean"] is clip  # every other metric on every tick


def test_load_pair_reads_the_clip_metrics_on_fast_ticks(tmp_path):
    """From the store: a method run that fires at ticks 0, 2, 4 keeps pg_clipfrac, ppo_kl and the effective
    token fraction at ticks 1, 3, 5 only, and every tick of its score."""
    from mlflow.entities import Metric

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.init_store(tracking_uri=uri)
    client = tracking.client(uri)
    exp = tracking.ensure_experiment(tracking.experiment_name("F"), uri, client)
    run = client.create_run(exp, tags={"kind": "train", "condition": "method", "seed": "0"})
    fired = [t % 2 == 0 for t in range(6)]
    logged = {"anchor/fire": [float(f) for f in fired], "score/mean": [0.5] * 6}
    logged |= {k: [0.0 if f else 0.3 for f in fired] for k in FAST_TICK_METRICS}
    points = [Metric(k, v, 0, t) for k, values in logged.items() for t, v in enumerate(values)]
    client.log_batch(run.info.run_id, metrics=points)
    (loaded,) = load_pair("F", uri).train
    for key in FAST_TICK_METRICS:
        assert loaded.metrics[key].steps.tolist() == [1, 3, 5] and set(loaded.metrics[key].values) == {0.3}
    assert loaded.metrics["score/mean"].steps.tolist() == list(range(6))


def test_figure_9_says_it_draws_the_fast_ticks(monkeypatch, tmp_path):
    result, _ = draw(monkeypatch, tmp_path, fg.clip_figure, pair())
    assert "on the ticks the anchor did not fire" in result.caption


def test_the_log_panel_states_its_floor(monkeypatch, tmp_path):
    """prob_gap's band reaches below 0: its lower end is drawn at the axis floor."""
    result, fig = draw(monkeypatch, tmp_path, fg.mismatch_figure, pair())
    log_ax = fig.axes[1]
    assert log_ax.get_yscale() == "log"
    floor = log_ax.get_ylim()[0]
    assert f"The log-scale panel starts at {floor:.3g}" in result.caption
    assert "a band reaching the floor includes 0" in result.caption


def test_curve_and_bar_captions_warn_that_a_band_can_leave_the_metrics_range(monkeypatch, tmp_path):
    curve, _ = draw(monkeypatch, tmp_path, fg.score_figure, pair())
    bars, _ = draw(monkeypatch, tmp_path, fg.best_validation_figure, pair())
    for result in (curve, bars):
        assert fg.RANGE_CAPTION in result.caption
    assert "can reach past the metric's range" in fg.RANGE_CAPTION


def test_the_reports_own_figures_do_not_reuse_a_number_of_the_notes(monkeypatch, tmp_path):
    """A figure that reproduces one of the note's (Figures 1-11) says so in its caption and has its number;
    the report's own figures are numbered after the note's last."""
    runs = pair()
    numbers = []
    for figure in fg.FIGURES:
        result = figure(runs, condition_colours(runs.conditions()), tmp_path)
        numbers.append(result.number)
        if f"The note's Figure {result.number}" not in result.caption:
            assert result.number > 11, (result.file, result.number)
    assert len(numbers) == len(set(numbers))


def test_a_caption_names_the_panels_with_fewer_seeds(monkeypatch, tmp_path):
    """One method seed lacks the sign-agreement metric: the caption gives n=3 and names the panel with 2."""
    runs = pair()
    del runs.train[-1].metrics["sign_memory/agreement"]
    result, _ = draw(monkeypatch, tmp_path, fg.diagnostics_figure, runs)
    assert "Seeds: method n=3 (n=2 in 'sign agreement with M')." in result.caption
    full, _ = draw(monkeypatch, tmp_path, fg.diagnostics_figure, pair())
    assert "Seeds: method n=3." in full.caption
