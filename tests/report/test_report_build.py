"""``build_report`` on a real MLflow sqlite store filled with known series (see conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from commrl import tracking
from commrl.report import ClaimThresholds, ReportInputError, build_report, evaluate_claims
from commrl.report.runs import load_pair

DRAWN_A = [
    "fig02_score_A.png",
    "fig03_val_A.png",
    "fig04_benchmarks_A.png",
    "fig05_mismatch_A.png",
    "fig06_kl_A.png",
    "fig07_best_val_A.png",
    "fig08_async_clip_A.png",
    "fig09_clip_A.png",
]
DRAWN_B = ["fig02_score_B.png", "fig05_mismatch_B.png"]


def table(built, pair: str, key: str) -> dict[str, dict]:
    """``condition (first column) -> {column: value}`` of one table of the built report."""
    t = next(t for t in built.tables[pair] if t.key == key)
    return {row[0]: dict(zip(t.columns, row, strict=True)) for row in t.rows}


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
    captions = json.loads((built.out_dir / "captions.json").read_text())
    assert sorted(captions) == sorted(DRAWN_A + DRAWN_B)
    assert all(len(text) > 20 for text in captions.values())


def test_table_values_equal_the_logged_inputs(built):
    scores = table(built, "A", "final_scores")
    assert scores["dense"]["tick"] == 50 and scores["dense"]["score"] == pytest.approx(0.3 + 0.008 * 50)
    assert scores["method"]["seeds"] == 2
    assert scores["method"]["score"] == pytest.approx(0.7)  # the mean of the seeds' 0.69 and 0.71
    assert scores["anchor_off"]["gain"] == pytest.approx(0.0)
    assert scores["dense"]["ticks asked"] == 60 and scores["dense"]["last tick"] == 60
    kl = table(built, "A", "kl")
    assert kl["dense"]["KL @ 50"] == pytest.approx(0.01) and kl["method"]["KL @ 50"] == pytest.approx(1.0)
    assert kl["dense"]["KL @ 100"] is None and kl["prf_mask"]["KL @ last"] == pytest.approx(0.12)
    val = table(built, "A", "best_validation")
    assert val["method"]["best"] == pytest.approx(0.68) and val["anchor_off"]["best tick"] == 0
    mismatch = table(built, "A", "mismatch")
    assert mismatch["dense"]["log-prob corr"] == pytest.approx(0.999)
    assert mismatch["method"]["async clip eps 0.2"] == pytest.approx(0.7)
    comm = table(built, "A", "bytes")
    assert comm["method"]["mean ratio vs dense"] == pytest.approx(0.1)
    assert comm["method"]["cumulative / dense"] == pytest.approx(0.1)
    assert comm["dense"]["cumulative bytes"] == pytest.approx(61000.0)
    bench = {(r[1], r[2]): r for r in next(t for t in built.tables["A"] if t.key == "benchmarks").rows}
    columns = next(t for t in built.tables["A"] if t.key == "benchmarks").columns
    assert bench[("commrl_math500", "acc")][columns.index("method")] == pytest.approx(0.68)
    assert bench[("commrl_amc23", "pass_at_8")][columns.index("dense")] == pytest.approx(0.8)
    assert bench[("mmlu_stem", "acc")][0] == "MMLU-STEM"
    sweeps = {row[0]: row for row in next(t for t in built.tables["A"] if t.key == "sweeps").rows}
    # the pruned trial's 0.9 is not a result
    assert sweeps["sweep-A"][2:] == [
        3,
        "COMPLETE 2, PRUNED 1",
        "trial-0001",
        0.6,
        "rank=16, alpha=0.25, beta=0.25, cadence=20",
    ]
    assert sweeps["sweep/A-study"][2:] == [2, "COMPLETE 2", "trial 1", 0.66, "rank=32, alpha=0.25"]
    assert any("evaluation eval/commrl_math500 dropped: it is FAILED" in n for n in built.notes)


def test_tables_json_keeps_the_exact_values(built):
    data = json.loads((built.out_dir / "tables.json").read_text())
    kl = data["pairs"]["A"]["tables"]["kl"]
    row = next(r for r in kl["rows"] if r[0] == "dense")
    assert row[kl["columns"].index("KL @ 50")] == pytest.approx(0.01)
    assert row[kl["columns"].index("KL @ 150")] is None
    assert data["pairs"]["A"]["read_at"] == 50 and data["pairs"]["B"]["read_at"] is None


def test_claims_are_pass_miss_or_na_as_designed(built):
    status = {pair: {c.number: c.status for c in claims} for pair, claims in built.claims.items()}
    assert status["A"] == {**{n: "PASS" for n in range(1, 12)}, 10: "n/a"}
    assert status["B"] == {
        1: "PASS",
        2: "MISS",
        3: "n/a",
        4: "n/a",
        5: "n/a",
        6: "PASS",
        7: "PASS",
        8: "n/a",
        9: "n/a",
        10: "MISS",
        11: "n/a",
    }
    claim4 = next(c for c in built.claims["A"] if c.number == 4)
    assert claim4.values["tick"] == 60 and claim4.values["ratio"] == pytest.approx(100.0)
    assert "6.1" in claim4.note
    saved = json.loads((built.out_dir / "claims.json").read_text())
    assert saved["thresholds"]["kl_min_ratio_method_dense"] == 10.0
    assert [c["status"] for c in saved["pairs"]["B"]][1] == "MISS"


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
    assert run.data.metrics["claims/B/MISS"] == 2.0


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
