"""``commrl compare``: two reports of one study, cell by cell and claim by claim (hand-built reports)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from commrl.cli.main import main
from commrl.report import stats as st
from commrl.report.compare import cell_interval, compare_reports, expected_inside, write_comparison
from commrl.report.runs import ReportInputError
from commrl.report.tables import cell_json


def t_cell(values: list[float]) -> dict:
    """A ``tables.json`` interval cell of these seeds, as the report writes it."""
    return cell_json(st.mean_interval(values))


def write_report(
    directory: Path,
    val: dict[str, list[float]],
    status: str = "PASS",
    rule: str = "score(read) - start >= 0.05",
    read_at: int = 40,
) -> Path:
    directory.mkdir(parents=True)
    rows = [
        [c, len(v), t_cell(v), {"mean": 1.0, "low": "-inf", "high": "inf", "n": 3, "method": "fieller"}]
        for c, v in val.items()
    ]
    tables = {
        "pairs": {
            "tiny": {
                "read_at": read_at,
                "tables": {
                    "best_validation": {
                        "columns": ["condition", "seeds", "at read tick", "ratio"],
                        "rows": rows,
                    },
                    "sweeps": {"columns": ["sweep", "objective"], "rows": [["s", t_cell([0.1, 0.2])]]},
                },
            }
        }
    }
    claims = {
        "pairs": {
            "tiny": [
                {
                    "number": 1,
                    "claim": "dense learns",
                    "threshold": rule,
                    "status": status,
                    "estimate": 0.1,
                    "low": 0.05,
                    "high": 0.15,
                    "n": 3,
                }
            ]
        }
    }
    (directory / "tables.json").write_text(json.dumps(tables))
    (directory / "claims.json").write_text(json.dumps(claims))
    return directory


BASE = {"dense": [0.60, 0.64, 0.62], "method": [0.50, 0.58, 0.54]}


def test_a_report_against_itself_is_identical_everywhere(tmp_path):
    base = write_report(tmp_path / "a", BASE)
    c = compare_reports(base, base)
    assert len(c.cells) == 2  # the infinite ratio and the sweep are left out
    assert all(x.identical and x.inside and x.differs is False for x in c.cells)
    assert c.summary()["same_verdict"] == 1 and not c.only_in_one


def test_a_shift_beyond_the_noise_is_flagged_and_one_within_it_is_not(tmp_path):
    base = write_report(tmp_path / "a", BASE)
    other = write_report(
        tmp_path / "b", {"dense": [0.61, 0.63, 0.625], "method": [0.80, 0.82, 0.84]}, status="INCONCLUSIVE"
    )
    cells = {x.row: x for x in compare_reports(base, other).cells}
    assert not cells["dense"].identical and cells["dense"].inside and cells["dense"].differs is False
    assert cells["method"].inside is False and cells["method"].differs is True
    c = compare_reports(base, other)
    assert c.summary()["same_verdict"] == 0
    assert c.summary()["difference_excludes_zero"] == 1


def test_a_claim_whose_rule_changed_and_a_pair_read_elsewhere_are_not_compared_as_noise(tmp_path):
    """A verdict under another rule (a threshold, a read-out, a level) answers another question, and cells
    read at another tick measure another quantity: the comparison says so instead of counting them."""
    base = write_report(tmp_path / "a", BASE)
    other = write_report(tmp_path / "b", BASE, status="MISS", rule="score(read) - start >= 0.1", read_at=30)
    c = compare_reports(base, other)
    (claim,) = c.claims
    assert claim.rule_changed and claim.same_verdict is None
    assert c.summary()["rule_changed"] == ["tiny 1"] and c.summary()["same_verdict"] == 0
    lines = c.summary_lines()
    assert "claims with the same verdict: 0 of 0 (not compared, their rule changed: tiny 1)" in lines
    assert any("tiny is read at tick 40 in the base and 30 in the other" in line for line in lines)
    same = compare_reports(base, write_report(tmp_path / "c", BASE))
    assert not same.claims[0].rule_changed and same.claims[0].same_verdict and not same.read_points


def test_the_difference_from_two_summaries_is_welchs_interval_on_the_seeds():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.5, 0.1, 3), rng.normal(0.6, 0.2, 4)
    got = st.summary_difference(st.mean_interval(a), st.mean_interval(b))
    want = st.difference_interval(
        {f"a{i}": v for i, v in enumerate(a)}, {f"b{i}": v for i, v in enumerate(b)}
    )
    assert got.estimate == pytest.approx(want.estimate)
    assert (got.low, got.high) == pytest.approx((want.low, want.high), rel=1e-12)
    p = sps.ttest_ind(a, b, equal_var=False).pvalue
    assert (got.low <= 0 <= got.high) == (p >= 0.05)


def test_no_difference_without_two_t_intervals():
    one = st.mean_interval([0.5])
    assert st.summary_difference(one, st.mean_interval([0.4, 0.6])) is None
    assert cell_interval({"mean": 1.0, "low": "-inf", "high": "inf", "n": 3, "method": "fieller"}) is None
    assert cell_interval(3) is None and cell_interval(None) is None


def test_expected_inside_is_the_simulated_chance_of_a_mean_in_anothers_interval():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4000, 2, 3))
    means, sd = x.mean(-1), x.std(-1, ddof=1)
    half = sps.t.ppf(0.975, 2) * sd[:, 0] / np.sqrt(3)
    inside = np.abs(means[:, 1] - means[:, 0]) <= half
    assert inside.mean() == pytest.approx(expected_inside(3), abs=0.015)
    assert expected_inside(3) == pytest.approx(0.907, abs=0.001)


def test_cli_writes_the_comparison_and_names_a_changed_verdict(tmp_path, capsys):
    base = write_report(tmp_path / "a", BASE)
    other = write_report(tmp_path / "b", {"dense": BASE["dense"]}, status="MISS")
    out = tmp_path / "cmp"
    assert main(["compare", str(base), str(other), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "claim 1 (dense learns): PASS -> MISS" in printed
    assert "1 interval cells in both reports, 1 identical" in printed
    data = json.loads((out / "compare.json").read_text())
    assert data["only_in_one"] == [f"tiny/best_validation/method/at read tick: only in {base}"]
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert "| tiny | 1 | dense learns | PASS" in (out / "compare.md").read_text()


def test_a_missing_report_is_refused_with_the_fix(tmp_path, capsys):
    with pytest.raises(ReportInputError, match=r"tables\.json: no such file.*commrl report"):
        compare_reports(tmp_path, tmp_path)
    assert main(["compare", str(tmp_path), str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "commrl compare: error:" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_write_comparison_without_t_cells_draws_nothing(tmp_path):
    base = write_report(tmp_path / "a", {"dense": [0.6]})
    written = write_comparison(compare_reports(base, base), tmp_path / "o")
    assert [p.name for p in written] == ["compare.md", "compare.json"]


def test_each_metric_of_a_benchmark_is_a_cell_of_its_own(tmp_path):
    """The benchmarks table has a row per (benchmark, metric): avg@8's acc and pass@8 rows share their
    first cell, and both are compared; a key met twice is refused rather than merged."""
    base = write_report(tmp_path / "a", BASE)
    tables = json.loads((base / "tables.json").read_text())
    rows = [
        ["toy (avg@8)", "toy_avg8", "acc", t_cell([0.50, 0.52, 0.49]), t_cell([0.44, 0.45, 0.44])],
        ["toy (avg@8)", "toy_avg8", "pass_at_8", t_cell([0.93, 0.94, 0.92]), t_cell([0.94, 0.93, 0.94])],
    ]
    benchmarks = {"columns": ["benchmark", "task", "metric", "dense", "method"], "rows": rows}
    tables["pairs"]["tiny"]["tables"]["benchmarks"] = benchmarks
    (base / "tables.json").write_text(json.dumps(tables))
    got = {
        (x.row, x.column): x.base.estimate
        for x in compare_reports(base, base).cells
        if x.table == "benchmarks"
    }
    assert got == {
        ("toy (avg@8)/toy_avg8/acc", "dense"): pytest.approx(0.5033, abs=1e-4),
        ("toy (avg@8)/toy_avg8/acc", "method"): pytest.approx(0.4433, abs=1e-4),
        ("toy (avg@8)/toy_avg8/pass_at_8", "dense"): pytest.approx(0.93),
        ("toy (avg@8)/toy_avg8/pass_at_8", "method"): pytest.approx(0.9367, abs=1e-4),
    }
    rows.append(rows[0])
    (base / "tables.json").write_text(json.dumps(tables))
    with pytest.raises(
        ReportInputError, match=r"two cells named tiny/benchmarks/toy \(avg@8\)/toy_avg8/acc/dense"
    ):
        compare_reports(base, base)
