"""MATH, MATH500 and DeepScaleR preparation from fixture files in each upstream column layout.

The hub cannot be reached here, so the sources are the small files in tests/fixtures/data/; the hub path
is exercised only for its offline error (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1, empty HF cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from commrl.cli.main import main
from commrl.data.files import sha256_file, write_dataset
from commrl.data.math_datasets import MATH500_HUB_ID, ground_truth, normalize_problem, prepare_real
from commrl.data.schema import QWEN_MATH_TEMPLATE, DataError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
MATH_DIR, MATH500 = FIXTURES / "hendrycks_math", FIXTURES / "math500" / "test.jsonl"
DEEPSCALER = FIXTURES / "deepscaler" / "deepscaler.json"


def prepare_cli(*args: str) -> int:
    return main(["prepare", *args])


def test_math_train_from_hub_snapshot_layout(tmp_path: Path) -> None:
    out = tmp_path / "math"
    assert (
        prepare_cli(
            "--dataset", "math", "--source", str(MATH_DIR), "--exclude", str(MATH500), "--out", str(out)
        )
        == 0
    )
    frame = pd.read_parquet(out / "train.parquet")
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert set(frame["data_source"]) == {"commrl/math"}
    assert set(frame["ability"]) == {"math"}
    truths = [rm["ground_truth"] for rm in frame["reward_model"]]
    assert truths == ["4", "3", "2", "\\frac{5}{9}"]  # last \boxed of the solution, nested braces kept
    assert all(rm["style"] == "rule" for rm in frame["reward_model"])
    first = frame.iloc[0]
    assert list(first["prompt"]) == [
        {
            "role": "user",
            "content": QWEN_MATH_TEMPLATE.replace("{problem}", "What is the value of $x$ if $2x + 3 = 11$?"),
        }
    ]
    info = first["extra_info"]
    assert (info["split"], info["index"], info["level"], info["subject"]) == (
        "train",
        0,
        "Level 1",
        "Algebra",
    )
    assert [i["index"] for i in frame["extra_info"]] == [0, 1, 2, 3]
    assert not any("test-split" in i["problem"] for i in frame["extra_info"])  # algebra/test.jsonl ignored
    assert not (out / "train.jsonl").exists()  # not a held-out split

    m = json.loads((out / "manifest.json").read_text())
    assert (m["rows_in"], m["rows_out"], m["rows_removed_overlap"]) == (7, 4, 1)
    assert m["rows_rejected"] == {"empty_boxed_answer": 1, "no_boxed_answer_in_solution": 1}
    assert m["rows_in"] == m["rows_out"] + sum(m["rows_rejected"].values()) + m["rows_removed_overlap"]
    assert m["exclude"]["problems"] == 5 and m["source_kind"] == "local"
    assert m["prompt_template"] == QWEN_MATH_TEMPLATE
    assert m["outputs"]["train.parquet"] == {
        "split": "train",
        "rows": 4,
        "sha256": sha256_file(out / "train.parquet"),
    }
    assert m["created_by"]["commrl_version"] and m["created_by"]["args"]["dataset"] == "math"


def test_exclude_accepts_prepared_math500_parquet(tmp_path: Path) -> None:
    """The pipeline passes the prepared results/data/math500/test.parquet (verl schema) as --exclude."""
    assert prepare_cli("--dataset", "math500", "--source", str(MATH500), "--out", str(tmp_path / "m500")) == 0
    for exclude in (tmp_path / "m500" / "test.parquet", tmp_path / "m500"):
        prepared = prepare_real("math", source=str(MATH_DIR), exclude=str(exclude))
        # the MATH500 row without an answer was rejected there, so 4 problems remain to exclude
        assert prepared.manifest["exclude"]["problems"] == 4
        assert prepared.manifest["rows_removed_overlap"] == 1 and len(prepared.splits["train"]) == 4
    with pytest.raises(DataError, match="has no problem texts"):
        prepare_real("math", source=str(MATH_DIR), exclude=str(FIXTURES / "bad_layout.jsonl"))


def test_math500_held_out_writes_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "m500"
    assert prepare_cli("--dataset", "math500", "--source", str(MATH500), "--out", str(out)) == 0
    table = pq.read_table(out / "test.parquet")
    assert table.schema.field("prompt").type.value_type.names == ["role", "content"]
    rows = table.to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["4", "6", "10", "16"]  # answer, else boxed
    assert (
        rows[0]["extra_info"]["unique_id"] == "test/algebra/0001.json"
        and rows[0]["extra_info"]["level"] == "2"
    )
    lines = [json.loads(x) for x in (out / "test.jsonl").read_text().splitlines()]
    assert [x["answer"] for x in lines] == ["4", "6", "10", "16"]
    assert lines[1]["problem"] == "How many positive divisors does 12 have?"
    assert lines[1]["prompt"] == rows[1]["prompt"][0]["content"]
    m = json.loads((out / "manifest.json").read_text())
    assert m["rows_rejected"] == {"no_boxed_answer_in_solution": 1} and m["rows_removed_overlap"] == 0
    assert m["exclude"] is None and set(m["outputs"]) == {"test.parquet", "test.jsonl"}


def test_deepscaler_json_array_and_custom_template(tmp_path: Path) -> None:
    out = tmp_path / "dsr"
    template = "Problem: {problem}\nAnswer inside \\boxed{}."
    assert (
        prepare_cli(
            "--dataset",
            "deepscaler",
            "--source",
            str(DEEPSCALER),
            "--exclude",
            str(MATH500),
            "--out",
            str(out),
            "--prompt-template",
            template,
        )
        == 0
    )
    rows = pq.read_table(out / "train.parquet").to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["13", "5", "\\frac{1}{4}"]
    assert (
        rows[0]["prompt"][0]["content"]
        == "Problem: Let $a+b=5$ and $ab=6$. Find $a^2+b^2$.\nAnswer inside \\boxed{}."
    )
    assert [r["extra_info"]["source_index"] for r in rows] == [0, 1, 2]
    m = json.loads((out / "manifest.json").read_text())
    assert m["rows_rejected"] == {"empty_problem": 1, "no_boxed_answer_in_solution": 1}
    assert m["rows_removed_overlap"] == 0 and m["exclude"]["problems"] == 5
    assert m["prompt_template"] == template and m["data_source"] == "commrl/deepscaler"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_deepscaler_loses_math500_problems_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pair B validates on MATH500, so DeepScaleR has MATH500 removed without any --exclude (as MATH has).
    The hub is served by a stand-in for ``datasets.load_dataset`` reading rows this test writes."""
    import datasets

    m500 = write_jsonl(
        tmp_path / "math500.jsonl",
        [
            {
                "problem": "What is the value of $513^2 - 487^2$?",
                "solution": "\\boxed{26000}",
                "answer": "26000",
            },
            {"problem": "Compute $\\dbinom{5}{2}$.", "solution": "\\boxed{10}", "answer": "10"},
        ],
    )
    calls = []

    def hub(hub_id: str, config: str | None = None, *, split: str) -> datasets.Dataset:
        calls.append((hub_id, config, split))
        assert hub_id == MATH500_HUB_ID, f"only MATH500 comes from the hub here, not {hub_id}"
        return datasets.Dataset.from_json(str(m500))

    monkeypatch.setattr(datasets, "load_dataset", hub)
    source = write_jsonl(
        tmp_path / "deepscaler.jsonl",
        [
            {"problem": "what is the value of  $513^2 - 487^2$?", "answer": "26000", "solution": ""},
            {"problem": "Compute 2+2.", "answer": "4", "solution": ""},
        ],
    )
    prepared = prepare_real("deepscaler", source=str(source))
    assert [r["extra_info"]["problem"] for r in prepared.splits["train"]] == ["Compute 2+2."]
    m = prepared.manifest
    assert (m["rows_in"], m["rows_out"], m["rows_removed_overlap"]) == (2, 1, 1)
    assert m["exclude"]["source"] == MATH500_HUB_ID and m["exclude"]["problems"] == 2
    assert calls == [(MATH500_HUB_ID, None, "test")]
    out = tmp_path / "dsr"
    assert prepare_cli("--dataset", "deepscaler", "--source", str(source), "--out", str(out)) == 0
    assert "1 removed as MATH500 overlap" in capsys.readouterr().out
    assert json.loads((out / "manifest.json").read_text())["rows_removed_overlap"] == 1


NUMERIC_ANSWERS = [0.3, 123456789012345678, None, 2.0, 1e-5]
NUMERIC_TRUTHS = ["0.3", "123456789012345678", "7", "2", "1e-05", "0.30", "1.00000000000000000001", "1e400"]


def numeric_rows() -> list[dict]:
    """Answers as JSON numbers: floats, an integer beyond 2**53 and a null among them (a float column)."""
    return [
        {"problem": f"Problem {i}.", "answer": a, "solution": "\\boxed{7}"}
        for i, a in enumerate(NUMERIC_ANSWERS)
    ]


def test_local_json_numeric_answers_keep_their_text(tmp_path: Path) -> None:
    """A JSON number reaches the ground truth as written: no float rounding (0.3 is not
    0.30000000000000004, 123456789012345678 not 123456789012345680), no trailing digits lost."""
    written = [
        '{"problem": "Problem 5.", "answer": 0.30, "solution": ""}',
        '{"problem": "Problem 6.", "answer": 1.00000000000000000001, "solution": ""}',
        '{"problem": "Problem 7.", "answer": 1e400, "solution": ""}',
    ]
    lines = [json.dumps(r) for r in numeric_rows()] + written
    jsonl = tmp_path / "dsr.jsonl"
    jsonl.write_text("\n".join(lines) + "\n")
    array = tmp_path / "dsr.json"
    array.write_text("[" + ",\n".join(lines) + "]")
    for source in (jsonl, array):
        prepared = prepare_real("deepscaler", source=str(source), exclude=str(MATH500))
        truths = [r["reward_model"]["ground_truth"] for r in prepared.splits["train"]]
        assert truths == NUMERIC_TRUTHS, source


def test_numbers_from_parquet_are_exact_or_rejected_by_row(tmp_path: Path) -> None:
    """Parquet integers stay exact beside nulls; a float column's integer beyond 2**53 (which the float may
    have rounded) is an error naming the row and column, never a silently wrong ground truth."""
    ints = tmp_path / "ints.parquet"
    pq.write_table(
        pa.table(
            {
                "problem": ["A.", "B."],
                "answer": pa.array([123456789012345678, None], pa.int64()),
                "solution": ["", "\\boxed{3}"],
            }
        ),
        ints,
    )
    prepared = prepare_real("deepscaler", source=str(ints), exclude=str(MATH500))
    assert [r["reward_model"]["ground_truth"] for r in prepared.splits["train"]] == [
        "123456789012345678",
        "3",
    ]
    floats = tmp_path / "floats.parquet"
    pq.write_table(
        pa.table({"problem": ["A.", "B."], "answer": [0.5, 123456789012345678.0], "solution": ["", ""]}),
        floats,
    )
    with pytest.raises(
        DataError, match=r"row 1 \(0-based\), column 'answer'.*1\.2345678901234568e\+17.*as text"
    ):
        prepare_real("deepscaler", source=str(floats), exclude=str(MATH500))


def test_bad_jsonl_line_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "A.", "answer": "1"}\n\n{"problem": "B.", "answer": 2,}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl, line 3: not valid JSON"):
        prepare_real("deepscaler", source=str(bad), exclude=str(MATH500))
    bad.write_text('{"problem": "A.", "answer": "1"}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"line 2: a list, not a JSON object"):
        prepare_real("deepscaler", source=str(bad), exclude=str(MATH500))


def test_parquet_source_reads_like_jsonl(tmp_path: Path) -> None:
    src = tmp_path / "math500.parquet"
    pd.read_json(MATH500, lines=True, dtype=False).to_parquet(src)
    a, b = prepare_real("math500", source=str(src)), prepare_real("math500", source=str(MATH500))
    assert a.splits == b.splits


def test_overlap_match_is_whitespace_and_case_insensitive() -> None:
    assert normalize_problem("Evaluate  $\\left\\lceil  \\frac{7}{2} \\right\\rceil$.") == normalize_problem(
        "evaluate $\\left\\lceil \\frac{7}{2}\\right\\rceil$."
    )
    assert normalize_problem("What is 1+2?") != normalize_problem("What is 1+3?")
    assert ground_truth("", "so $\\boxed{\\frac{1}{2}}$") == ("\\frac{1}{2}", None)
    assert ground_truth("7", "") == ("7", None)
    assert ground_truth("", "no box") == (None, "no_boxed_answer_in_solution")
    assert ground_truth("", "") == (None, "no_answer")


def test_missing_column_names_column_and_layouts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(
        DataError, match=r"no column 'problem'.*answer \(or solution\).*problem, answer, solution"
    ):
        prepare_real("deepscaler", source=str(FIXTURES / "bad_layout.jsonl"))
    out = tmp_path / "bad"
    assert (
        prepare_cli("--dataset", "math500", "--source", str(FIXTURES / "bad_layout.jsonl"), "--out", str(out))
        == 2
    )
    assert "HuggingFaceH4/MATH-500: problem, solution, answer" in capsys.readouterr().err
    assert not out.exists()


def test_bad_template_and_misplaced_toy_knobs(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no \{problem\} placeholder"):
        prepare_real("math500", source=str(MATH500), template="Solve it.")
    assert (
        prepare_cli(
            "--dataset", "math500", "--source", str(MATH500), "--out", str(tmp_path / "x"), "--n-train", "5"
        )
        == 2
    )
    assert not (tmp_path / "x").exists()


def test_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepared = prepare_real("math500", source=str(MATH500))
    rows = prepared.splits["test"]
    broken = type(prepared)(
        splits={"test": [*rows, {**rows[0], "prompt": object()}]},
        held_out=("test",),
        manifest=prepared.manifest,
    )
    with pytest.raises((TypeError, ValueError)):  # pyarrow cannot convert the bad row
        write_dataset(out, broken)
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("old")
    with pytest.raises((TypeError, ValueError)):
        write_dataset(out, broken)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_unreachable_hub_id_says_how_to_supply_it(tmp_path: Path) -> None:
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = tmp_path / "m500"
    proc = subprocess.run(
        [sys.executable, "-m", "commrl.cli.main", "prepare", "--dataset", "math500", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "cannot load hub dataset 'HuggingFaceH4/MATH-500'" in proc.stderr
    assert "--source PATH" in proc.stderr and "HF_HOME" in proc.stderr
    assert not out.exists()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "commrl.cli.main",
            "prepare",
            "--dataset",
            "math",
            "--source",
            str(MATH_DIR),
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--exclude PATH" in proc.stderr, proc.stderr
    assert not out.exists()


def test_a_list_answer_is_joined_as_evaluation_joins_it_and_a_cell_that_is_no_text_is_counted(tmp_path):
    """MATH500 from a local jsonl: a list answer (OlympiadBench's layout) becomes its elements joined with
    ", " (as ``commrl.eval.problems.answer_text`` reads the same row), not its Python repr; an answer that
    is a boolean or a mapping, or a problem that is a mapping, is rejected and counted under its reason."""
    from commrl.eval.problems import answer_text

    rows = [
        {"problem": "Roots of x^2 - 5x + 6?", "answer": ["2", "3"]},
        {"problem": "One root of x^2 - 4?", "answer": [2]},
        {"problem": "Is 7 prime?", "answer": True},
        {"problem": "What is x?", "answer": {"x": 1}},
        {"problem": {"text": "a mapping"}, "answer": "1"},
    ]
    out = tmp_path / "m500"
    source = str(write_jsonl(tmp_path / "s.jsonl", rows))
    assert prepare_cli("--dataset", "math500", "--source", source, "--out", str(out)) == 0
    kept = pq.read_table(out / "test.parquet").to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in kept] == ["2, 3", "2"]
    assert [r["reward_model"]["ground_truth"] for r in kept] == [answer_text(r["answer"]) for r in rows[:2]]
    m = json.loads((out / "manifest.json").read_text())
    assert m["rows_rejected"] == {"answer_not_text": 2, "problem_not_text": 1}
    assert m["rows_in"] == m["rows_out"] + sum(m["rows_rejected"].values())
