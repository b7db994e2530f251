"""``build_report`` on a real MLflow sqlite store filled with known series (see conftest.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from PIL import Image

from commrl import tracking
from commrl.report import ClaimThresholds, ReportInputError, build_report, evaluate_claims
from commrl.report import curves as cv
from commrl.report.figures import plot_curve
from commrl.report.runs import Series, load_pair
from commrl.report.stats import Interval, mean_interval
from commrl.report.style import CONDITION_COLOURS

DRAWN_A = [
    "fig02_score_A.png",
    "fig03_val_A.png",
    "fig04_benchmarks_A.png",
    "fig05_mismatch_A.png",
    "fig06_kl_A.png",
    "fig07_best_val_A.png",
    "fig08_async_clip_A.png",
    "fig09_clip_A.png",
    "fig14_async_A.png",
]
DRAWN_B = ["fig02_score_B.png", "fig05_mismatch_B.png"]


def table(built, pair: str, key: str) -> dict[str, dict]:
    """``condition (first column) -> {column: value}`` of one table of the built report."""
    t = next(t for t in built.tables[pair] if t.key == key)
    return {row[0]: dict(zip(t.columns, row, strict=True)) for row in t.rows}


def is_interval(cell, n: int, mean: float, point: bool = False) -> bool:
    """``cell`` is the seed mean ``mean`` of ``n`` seeds with an interval around it (a point if asked)."""
    assert isinstance(cell, Interval), cell
    assert cell.n == n and cell.estimate == pytest.approx(mean)
    if point:
        return cell.low == pytest.approx(mean) and cell.high == pytest.approx(mean)
    return cell.low < mean < cell.high


def test_every_expected_file_exists_and_figures_are_valid_pngs(built):
    out = built.out_dir
    documents = ["report.md", "report.html", "tables.json", "claims.json", "captions.json"]
    for name in documents + DRAWN_A + DRAWN_B:
        assert (out / name).is_file(), name
    for name in DRAWN_A + DRAWN_B:
        with Image.open(out / name) as img:
            img.verify()
        with Image.open(out / name) as img:
            assert img.format == "PNG" and 400 <= img.width <= 3000 and 300 <= img.height <= 2000
    assert sorted(f.name for f in out.glob("*.png")) == sorted(DRAWN_A + DRAWN_B)
    assert sorted(p.name for p in built.files) == sorted(p.name for p in out.iterdir())
    assert not list(out.parent.glob(".report.*")), "temporary directories left behind"


def test_markdown_embeds_figures_html_inlines_them_captions_name_them(built):
    md = (built.out_dir / "report.md").read_text()
    html = (built.out_dir / "report.html").read_text()
    for name in DRAWN_A + DRAWN_B:
        assert f"]({name})" in md
    assert html.count("data:image/png;base64,") == len(DRAWN_A + DRAWN_B)
    assert "<style>" in html and 'class="PASS"' in html and 'class="MISS"' in html
    assert 'class="INCONCLUSIVE"' in html
    captions = json.loads((built.out_dir / "captions.json").read_text())
    assert sorted(captions) == sorted(DRAWN_A + DRAWN_B)
    assert all(len(text) > 20 for text in captions.values())


def test_table_values_are_seed_means_with_intervals_of_the_logged_inputs(built):
    scores = table(built, "A", "final_scores")
    assert scores["dense"]["tick"] == 50 and is_interval(scores["dense"]["score"], 3, 0.3 + 0.008 * 50)
    assert scores["method"]["seeds"] == 3
    assert is_interval(scores["method"]["score"], 3, 0.7)  # seeds 0.69, 0.71, 0.70 (+ slope spread)
    assert is_interval(scores["prf_mask"]["gain"], 3, 0.007 * 45, point=True)  # the same in every seed
    assert scores["anchor_off"]["gain"].estimate == pytest.approx(0.0, abs=1e-12)
    assert scores["dense"]["ticks asked"] == 60 and scores["dense"]["last tick"] == 60
    kl = table(built, "A", "kl")
    assert is_interval(kl["dense"]["KL @ 50"], 3, 0.01) and is_interval(kl["method"]["KL @ 50"], 3, 1.0)
    assert kl["dense"]["KL @ 100"] is None and is_interval(kl["prf_mask"]["KL @ last"], 3, 0.12)
    assert kl["prf_mask"]["last tick"] == 60
    val = table(built, "A", "best_validation")
    assert is_interval(val["method"]["best"], 3, 0.68)
    assert is_interval(val["anchor_off"]["best tick"], 3, 0.0, point=True)
    mismatch = table(built, "A", "mismatch")
    assert is_interval(mismatch["dense"]["log-prob corr"], 3, 0.999)
    assert is_interval(mismatch["method"]["async clip eps 0.2"], 3, 0.7)
    comm = table(built, "A", "bytes")
    assert is_interval(comm["method"]["ratio vs own dense at read"], 3, 0.1, point=True)
    assert is_interval(comm["method"]["cumulative / dense"], 3, 0.1, point=True)
    assert is_interval(comm["dense"]["cumulative bytes"], 3, 61000.0, point=True)
    bench = {(r[1], r[2]): r for r in next(t for t in built.tables["A"] if t.key == "benchmarks").rows}
    columns = next(t for t in built.tables["A"] if t.key == "benchmarks").columns
    assert is_interval(bench[("commrl_math500", "acc")][columns.index("method")], 3, 0.68)
    assert is_interval(bench[("commrl_amc23", "pass_at_8")][columns.index("dense")], 3, 0.8)
    assert bench[("commrl_mmlu_stem", "acc")][0] == "MMLU-STEM"
    one_seed = table(built, "B", "final_scores")["anchor_off"]["score"]
    assert one_seed.n == 1 and one_seed.low is None and one_seed.high is None
    sweeps = {row[0]: row for row in next(t for t in built.tables["A"] if t.key == "sweeps").rows}
    # the pruned trial's 0.9 is not a result
    assert sweeps["sweep-A"][2:] == [
        3,
        "COMPLETE 2, PRUNED 1",
        None,  # no seed tags
        "trial-0001",
        0.6,
        "rank=16, alpha=0.25, beta=0.25, cadence=20",
        "none",
    ]
    # one training seed behind every objective; on a tie the lowest trial number (not trial 2, which started
    # first), as best_params.json picks it; the tie named
    assert sweeps["sweep/A-study"][2:] == [
        3,
        "COMPLETE 3",
        "0",
        "trial 1",
        0.66,
        "rank=32, alpha=0.25",
        "trial 2",
    ]
    assert any("evaluation eval/commrl_math500 dropped: it is FAILED" in n for n in built.notes)


def test_tables_json_keeps_mean_low_high_and_n(built):
    data = json.loads((built.out_dir / "tables.json").read_text())
    kl = data["pairs"]["A"]["tables"]["kl"]
    row = next(r for r in kl["rows"] if r[0] == "dense")
    cell = row[kl["columns"].index("KL @ 50")]
    assert set(cell) == {"mean", "low", "high", "n", "method"}
    assert cell["mean"] == pytest.approx(0.01) and cell["n"] == 3 and cell["method"] == "t"
    assert cell["low"] < 0.01 < cell["high"]
    assert row[kl["columns"].index("KL @ 150")] is None
    assert data["pairs"]["A"]["read_at"] == 50 and data["pairs"]["B"]["read_at"] is None
    assert data["pairs"]["B"]["seeds"] == {"dense": 3, "method": 3, "anchor_off": 1, "method_same_sampler": 2}
    scores = data["pairs"]["B"]["tables"]["final_scores"]
    one = next(r for r in scores["rows"] if r[0] == "anchor_off")[scores["columns"].index("score")]
    assert one == {"mean": pytest.approx(0.3), "low": None, "high": None, "n": 1, "method": "none"}


def test_markdown_cells_read_mean_plus_minus_half_width_with_n_and_explain_the_rule(built):
    md = (built.out_dir / "report.md").read_text()
    assert md.count("## How to read the numbers") == 1
    assert "PASS when its 95% interval lies entirely on the claim's side" in md
    assert "Student's t" in md and "BCa bootstrap" in md and "Fieller" in md
    assert (
        "Seeds per condition (training runs): dense n=3, method n=3, anchor_off n=1, method_same_sampler n=2"
        in md
    )
    assert "Claims: 3 PASS, 1 MISS, 2 INCONCLUSIVE, 9 n/a." in md
    scores = mean_interval([0.69, 0.70, 0.71])  # dense's score at tick 50 over its seeds (pair A)
    assert f"| 0.7 ± {scores.half_width:.2g} (n=3) |" in md
    assert "| 0.3 (n=1) |" in md  # anchor_off in pair B: one seed, no interval


def test_claims_are_decided_on_the_seed_intervals_as_designed(built):
    status = {pair: {c.number: c.status for c in claims} for pair, claims in built.claims.items()}
    # no anchor_only (12) or method_same_sampler (10); claim 5 is about prf_mask and dropout, and dropout
    # was not run: prf_mask's check passes, the claim cannot
    assert status["A"] == {**{n: "PASS" for n in range(1, 16)}, 5: "INCONCLUSIVE", 10: "n/a", 12: "n/a"}
    assert status["B"] == {
        1: "PASS",
        2: "MISS",
        3: "INCONCLUSIVE",  # anchor_off has one seed
        4: "n/a",
        5: "n/a",
        6: "PASS",
        7: "PASS",
        8: "n/a",
        9: "n/a",
        10: "INCONCLUSIVE",  # two seeds, 0.45 and 0.55: the interval straddles 0.99
        11: "n/a",
        12: "n/a",
        13: "n/a",  # no asynchronous runs in pair B
        14: "n/a",
        15: "n/a",
    }
    claims_b = {c.number: c for c in built.claims["B"]}
    assert "n=1 vs 3: no interval" in claims_b[3].reason and claims_b[3].interval.low is None
    assert "straddles 0.99" in claims_b[10].reason and claims_b[10].n == 2
    assert claims_b[2].interval.high < -0.05 and claims_b[2].interval.paired
    claim4 = next(c for c in built.claims["A"] if c.number == 4)
    assert claim4.values["tick"] == 60 and claim4.values["ratio"] == pytest.approx(100.0)
    assert claim4.interval.method == "fieller" and 10 < claim4.interval.low < 100 < claim4.interval.high
    assert "6.1" in claim4.note
    claim2 = next(c for c in built.claims["A"] if c.number == 2)  # each seed mean with its interval
    assert re.match(r"method [\d.]+ ± [\d.e-]+ \(n=3\) \(tick 50\) vs dense [\d.]+ ± ", claim2.value), (
        claim2.value
    )
    claim5 = next(c for c in built.claims["A"] if c.number == 5)
    assert [k.status for k in claim5.checks] == ["PASS", "INCONCLUSIVE"]
    assert (
        claim5.value.endswith("; not run: dropout")
        and "KL dropout / method: dropout not run" in claim5.reason
    )
    claim9 = next(c for c in built.claims["A"] if c.number == 9)
    assert len(claim9.checks) == 2 and "dense async clip: 95% CI" in claim9.reason
    saved = json.loads((built.out_dir / "claims.json").read_text())
    assert saved["thresholds"]["kl_min_ratio_method_dense"] == 10.0
    for claims in saved["pairs"].values():
        for claim in claims:
            assert {"n", "estimate", "low", "high", "status", "reason", "checks"} <= set(claim)
    first = saved["pairs"]["A"][0]
    assert first["n"] == 3 and first["low"] < first["estimate"] < first["high"] and first["status"] == "PASS"
    assert first["checks"][0]["side"] == "at_least" and first["checks"][0]["threshold"] == 0.05
    assert saved["pairs"]["B"][2]["n"] == 1 and saved["pairs"]["B"][2]["low"] is None
    assert [c["status"] for c in saved["pairs"]["B"]][1] == "MISS"


def band_pixels(png: Path, colour: str) -> int:
    """Pixels of ``colour`` at the bands' alpha 0.2 over the white axes."""
    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    band = 255 + 0.2 * (np.array(to_rgb(colour)) * 255 - 255)
    return int(np.all(np.abs(img - band) <= 3, axis=-1).sum())


def test_curve_figures_draw_bands_for_several_seeds_and_a_line_for_one(built):
    png = built.out_dir / "fig02_score_B.png"
    assert band_pixels(png, CONDITION_COLOURS["dense"]) > 1000  # three seeds that spread
    assert band_pixels(png, CONDITION_COLOURS["method"]) > 1000
    assert band_pixels(png, CONDITION_COLOURS["anchor_off"]) < 50  # one seed: the line alone
    assert band_pixels(built.out_dir / "fig05_mismatch_A.png", CONDITION_COLOURS["dense"]) > 1000  # log panel
    captions = json.loads((built.out_dir / "captions.json").read_text())
    score_b = captions["fig02_score_B.png"]
    assert "95% confidence interval" in score_b
    assert "Seeds: dense n=3, method n=3, anchor_off n=1, method_same_sampler n=2." in score_b
    assert "Seeds: dense n=3, method n=3." in captions["fig04_benchmarks_A.png"]


def test_plot_curve_bands_are_the_per_tick_interval():
    runs = [Series.from_points([(0, 0.1 * k), (1, 0.2 + 0.1 * k)]) for k in range(3)]
    curve = cv.aggregate(runs)
    ax = Figure().subplots()
    plot_curve(ax, curve, "dense", "#2ca02c", markers=False)
    (band,) = ax.collections
    ys = band.get_paths()[0].vertices[:, 1]
    ref = mean_interval([0.0, 0.1, 0.2])
    assert ys.min() == pytest.approx(ref.low) and ys.max() == pytest.approx(ref.high + 0.2)
    assert ax.get_legend_handles_labels()[1] == ["dense (n=3)"]
    single = Figure().subplots()
    plot_curve(single, cv.aggregate(runs[:1]), "dense", "#2ca02c", markers=False)
    assert not single.collections and len(single.lines) == 1


def test_thresholds_decide_the_status(store_uri):
    runs = load_pair("A", store_uri)
    strict = ClaimThresholds.with_overrides({"dense_min_gain": 0.5, "gap_min_ratio": 1000})
    status = {c.number: c.status for c in evaluate_claims(runs, strict)}
    assert status[1] == "MISS" and status[8] == "MISS" and status[2] == "PASS"
    with pytest.raises(ReportInputError, match=r"unknown claim threshold.*dense_min_gain"):
        ClaimThresholds.with_overrides({"no_such": 1.0})


def test_missing_runs_give_a_visible_note_not_an_exception(built):
    md = (built.out_dir / "report.md").read_text()
    skipped = (
        "Figure 6 skipped (B): no runs with actor/kl_loss for conditions dense, method, dropout, prf_mask"
    )
    assert skipped in built.notes and skipped in md
    assert "Figure 6 (A): no runs with actor/kl_loss for dropout; drawn without them" in md
    assert "Figure 5 (B): panel 'probability gap (log scale)' is empty, no runs with mismatch/prob_gap" in md
    assert "Figure 4 skipped (B)" in md and not (built.out_dir / "fig04_benchmarks_B.png").exists()
    assert "KL to the reference policy (nats): no runs with actor/kl_loss in pair B" in md
    figure6_b = next(f for f in built.figures if f.pair == "B" and f.number == 6)
    assert not figure6_b.drawn


def test_report_run_holds_the_files_as_artifacts(built, store_uri):
    client = tracking.client(store_uri)
    run = client.get_run(built.run_id)
    assert run.data.tags["kind"] == "report" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "commrl/report"
    artifacts = {a.path for a in client.list_artifacts(built.run_id)}
    assert {"report.md", "report.html", "claims.json", "fig02_score_A.png"} <= artifacts
    assert run.data.metrics["claims/B/MISS"] == 1.0 and run.data.metrics["claims/B/INCONCLUSIVE"] == 2.0


def test_a_failed_report_keeps_the_previous_one_and_no_temporary_files(store_uri, tmp_path, monkeypatch):
    """The failure is injected (a raising HTML renderer); the store, figures and files are real."""
    out = tmp_path / "report"
    build_report(["B"], out, tracking_uri=store_uri)
    before = (out / "report.md").read_text()

    def broken(*args, **kwargs):
        raise RuntimeError("renderer broke")

    monkeypatch.setattr("commrl.report.build.to_html", broken)
    with pytest.raises(RuntimeError, match="renderer broke"):
        build_report(["A"], out, tracking_uri=store_uri)
    assert (out / "report.md").read_text() == before
    assert not (out / "fig02_score_A.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    failed = tracking.find_runs("commrl/report", {"kind": "report", "pairs": "A"}, store_uri)
    assert failed and failed[0].info.status == "FAILED"


def test_bad_input_is_refused_with_a_clear_message(store_uri, tmp_path):
    with pytest.raises(ReportInputError, match=r"pair 'nope'.*pairs there: A, B"):
        build_report(["nope"], tmp_path / "r", tracking_uri=store_uri)
    (tmp_path / "other").mkdir()
    Path(tmp_path / "other" / "keep.txt").write_text("x")
    with pytest.raises(ReportInputError, match="not a commrl report"):
        build_report(["B"], tmp_path / "other", tracking_uri=store_uri)
    assert (tmp_path / "other" / "keep.txt").exists() and not (tmp_path / "r").exists()


def test_the_async_conditions_are_read_from_the_store_drawn_tabulated_and_claimed(built):
    """Figure 14, the async table and claims 13-15 from pair A's async runs as MLflow holds them."""
    claims = {c.number: c for c in built.claims["A"]}
    starves = claims[13]
    assert [c.quantity for c in starves.checks] == [
        "method_async effective token frac (fast ticks)",
        "val gain method_async - dense_async",
    ]
    assert starves.checks[0].interval.estimate == pytest.approx(0.20)
    assert starves.values["method_async_gain"] == pytest.approx(0.05)
    assert starves.values["dense_async_gain"] == pytest.approx(0.21)
    closes = claims[14]
    assert closes.combine == "any" and closes.values["passing"] == "method_async_icepop"
    assert closes.reason.startswith("passing: val dense_async - method_async_icepop;")
    assert [c.status for c in closes.checks] == ["MISS", "PASS", "MISS"]  # tis, icepop, seq_rs
    assert closes.decided_by.quantity == "val dense_async - method_async_icepop"
    assert closes.interval.estimate == pytest.approx(0.02) and closes.interval.paired
    assert claims[15].interval.estimate == pytest.approx(0.005) and "inside ±0.05" in claims[15].reason
    rows = table(built, "A", "async")
    assert list(rows) == [
        "dense_async",
        "method_async",
        "method_async_tis",
        "method_async_icepop",
        "method_async_seq_rs",
        "dense_async_tis",
    ]
    assert rows["method_async"]["read tick"] == 50
    assert is_interval(rows["method_async"]["effective token frac"], 3, 0.20)
    assert is_interval(rows["method_async"]["rollout_corr kl"], 3, 0.5)
    assert is_interval(rows["dense_async"]["val gain"], 3, 0.21)
    assert is_interval(rows["method_async_tis"]["IS eff sample size"], 3, 0.6, point=True)
    assert rows["method_async"]["IS eff sample size"] is None
    assert is_interval(rows["method_async_seq_rs"]["RS seq masked frac"], 3, 0.3)
    assert "RS masked frac" not in rows["method_async"]  # no run logged the token-level rejection
    assert not any(t.key == "async" for t in built.tables["B"])
    md = (built.out_dir / "report.md").read_text()
    assert "#### Figure 14: Learning under asynchrony" in md and "](fig14_async_A.png)" in md
    skipped = (
        "Figure 14 skipped (B): no runs with val/acc or actor/effective_token_frac for conditions "
        "dense_async, method_async, method_async_tis, method_async_icepop, method_async_seq_rs, "
        "dense_async_tis"
    )
    assert skipped in md and not (built.out_dir / "fig14_async_B.png").exists()
    assert "| 14 | a rollout correction brings method_async's val to dense_async's |" in md
    assert "| no method_async runs with actor/effective_token_frac | n/a | inputs missing |" in md  # B
    saved = json.loads((built.out_dir / "claims.json").read_text())
    assert saved["thresholds"]["async_method_max_effective_frac"] == 0.35
    assert saved["pairs"]["A"][13]["combine"] == "any" and saved["pairs"]["B"][12]["status"] == "n/a"


def test_a_built_report_compared_with_itself_pairs_every_interval_cell_and_claim(built):
    from commrl.report.compare import compare_reports

    tables = json.loads((built.out_dir / "tables.json").read_text())
    intervals = sum(
        isinstance(cell, dict) and isinstance(cell.get("low"), float) and isinstance(cell.get("high"), float)
        for section in tables["pairs"].values()
        for name, table in section["tables"].items()
        if name != "sweeps"
        for row in table["rows"]
        for cell in row
    )
    c = compare_reports(built.out_dir, built.out_dir)
    assert len(c.cells) >= intervals > 20
    assert all(x.identical for x in c.cells) and c.summary()["difference_excludes_zero"] == 0
    assert c.summary()["claims"] == sum(len(v) for v in built.claims.values())
