"""``commrl report`` end to end on the shared synthetic store."""

from __future__ import annotations

import json

from commrl.cli.main import main


def test_cli_writes_the_report(store_uri, tmp_path, capsys):
    out = tmp_path / "report"
    rc = main(
        [
            "report",
            "--pair",
            "B",
            "--tracking-uri",
            store_uri,
            "--out",
            str(out),
            "--threshold",
            "dense_min_gain=0.9",
        ]
    )
    assert rc == 0
    assert {
        "report.md",
        "report.html",
        "tables.json",
        "claims.json",
        "captions.json",
        "fig02_score_B.png",
    } <= {p.name for p in out.iterdir()}
    claims = json.loads((out / "claims.json").read_text())
    assert claims["thresholds"]["dense_min_gain"] == 0.9
    assert claims["pairs"]["B"][0]["status"] == "MISS"  # gain 0.25 < 0.9
    assert "report of B" in capsys.readouterr().out


def test_cli_every_pair_by_default(store_uri, tmp_path):
    out = tmp_path / "all"
    assert main(["report", "--tracking-uri", store_uri, "--out", str(out)]) == 0
    assert sorted(json.loads((out / "tables.json").read_text())["pairs"]) == ["A", "B"]


def test_cli_unknown_pair_exits_2_and_writes_nothing(store_uri, tmp_path, capsys):
    out = tmp_path / "none"
    assert main(["report", "--pair", "Z", "--tracking-uri", store_uri, "--out", str(out)]) == 2
    assert "pair 'Z'" in capsys.readouterr().err
    assert not out.exists()
