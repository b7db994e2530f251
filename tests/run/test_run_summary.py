"""``summary.json``: one schema, one writer, one reader; the read point both drivers export."""

from __future__ import annotations

import json

import pytest

from commrl.run.summary import RunSummary, SummaryError, read_point


def test_round_trip_keeps_every_field_and_states_completeness(tmp_path):
    summary = RunSummary("A", "dense", 1, "verl", 150, 150, "r1", "/f", 100, "/t", {0: 0.5, 100: 0.7}, None)
    path = summary.write(tmp_path)
    written = json.loads(path.read_text())
    assert written["complete"] is True and written["val_acc"] == {"0": 0.5, "100": 0.7}
    assert RunSummary.read(path) == summary == RunSummary.read(tmp_path)


def test_the_read_point_is_final_at_the_last_tick_else_the_exported_folder(tmp_path):
    assert read_point(tmp_path, 40, 40, "/final") == "/final"
    assert read_point(tmp_path, 100, 150, "/final") is None  # not exported
    (tmp_path / "tick100").mkdir()
    assert read_point(tmp_path, 100, 150, "/final") == str(tmp_path / "tick100")
    assert read_point(tmp_path, 100, 60, "/final") is None  # never reached


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "is not JSON"),
        ("[]", "is not a JSON object"),
        ('{"mlflow_run_id": "x", "final_dir": "/f"}', "lacks pair, condition, seed, driver, ticks_asked"),
        (
            '{"pair": "A", "condition": "c", "seed": "x", "driver": "d", "ticks_asked": 1, '
            '"ticks_trained": 1, "read_at": 1}',
            "malformed value",
        ),
    ],
)
def test_a_bad_summary_names_the_file_and_the_fix(tmp_path, text, message):
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(SummaryError, match=message) as err:
        RunSummary.read(tmp_path / "summary.json")
    assert "summary.json" in str(err.value) and "rerun the training rule" in str(err.value)
    with pytest.raises(SummaryError, match="does not exist"):
        RunSummary.read(tmp_path / "none")
