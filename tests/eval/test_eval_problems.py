"""Reading and normalising benchmark problems; a missing dataset fails early with a clear message."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from eval_data import toy_rows, write_jsonl

from commrl.data.schema import QWEN_MATH_TEMPLATE, format_prompt
from commrl.eval import DatasetFormatError, DatasetUnavailableError, get_benchmark
from commrl.eval.problems import build_docs, load_rows, multiple_choice_doc, normalise


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"problem": "p", "answer": "\\frac{1}{2}"}, ("p", "\\frac{1}{2}")),  # MATH-500, aime25
        ({"Problem": "p", "Answer": 204}, ("p", "204")),  # Maxwell-Jia/AIME_2024
        ({"question": "p", "answer": 10.0}, ("p", "10")),  # amc23 stores floats
        ({"question": "p", "final_answer": ["$\\sqrt{2}$"]}, ("p", "\\sqrt{2}")),  # OlympiadBench
        ({"question": "p", "final_answer": ["$1$", "$2$"]}, ("p", "1, 2")),
        ({"Question": "p", "expected_answer": " 7 "}, ("p", "7")),
    ],
)
def test_columns_of_each_source_are_normalised(row, expected):
    (doc,) = normalise([row], "src")
    assert (doc["problem"], doc["answer"]) == expected


def test_missing_column_names_what_was_found_and_accepted():
    with pytest.raises(DatasetFormatError, match=r"no answer column; found problem, solution; accepted: ans"):
        normalise([{"problem": "p", "solution": "s"}], "src")
    with pytest.raises(DatasetFormatError, match=r"src: row 1 has an empty 'answer'"):
        normalise([{"problem": "p", "answer": "1"}, {"problem": "q", "answer": ""}], "src")


@pytest.mark.parametrize("answer", [float("nan"), None, [1, None], []])
def test_a_nan_or_missing_gold_is_rejected_not_scored(answer):
    """A float column's empty cell is NaN: scored, its gold "nan" would count the problem wrong."""
    with pytest.raises(DatasetFormatError, match=r"src: row 1 has an empty 'answer'"):
        normalise([{"problem": "p", "answer": 1.0}, {"problem": "q", "answer": answer}], "src")


def test_prompt_column_wins_unless_a_template_is_given(tmp_path):
    bench = get_benchmark("toy_greedy")
    rows = [
        {"problem": "1+2", "answer": "3", "prompt": "trained prompt 1+2"},
        {"problem": "2+2", "answer": "4"},
    ]
    docs = build_docs(bench, rows, "rows")
    assert docs[0]["prompt"] == "trained prompt 1+2"
    assert docs[1]["prompt"] == format_prompt(bench.prompt_template, "2+2")
    docs = build_docs(bench, rows, "rows", prompt_template="Q: {problem} A:")
    assert [d["prompt"] for d in docs] == ["Q: 1+2 A:", "Q: 2+2 A:"]
    math = build_docs(get_benchmark("commrl_math500"), [{"problem": "x?", "answer": "1"}], "rows")
    assert math[0]["prompt"] == format_prompt(QWEN_MATH_TEMPLATE, "x?")


def test_multiple_choice_doc_is_reproducible_and_right():
    doc = multiple_choice_doc("40+2", "42", 7)
    assert doc == multiple_choice_doc("40+2", "42", 7)
    assert doc["choices"][doc["gold"]] == "42"
    assert len(set(doc["choices"])) == 4
    assert doc["prompt"].startswith("40+2\nA. ") and doc["prompt"].endswith("\nAnswer:")
    golds = {multiple_choice_doc("40+2", "42", i)["gold"] for i in range(40)}
    assert golds == {0, 1, 2, 3}
    with pytest.raises(DatasetFormatError, match=r"3: multiple choice needs an integer answer, got '1/2'"):
        multiple_choice_doc("p", "1/2", 3)


def test_local_files_of_each_type(tmp_path):
    rows = toy_rows(3)
    bench = get_benchmark("toy_greedy")
    jsonl = write_jsonl(tmp_path / "t.jsonl", rows)
    (tmp_path / "t.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    for path in (jsonl, tmp_path / "t.json", tmp_path / "t.parquet"):
        loaded, source = load_rows(bench, path)
        assert loaded == rows and source == str(path)
    (tmp_path / "bad.jsonl").write_text('{"problem": "p", "answer": "1"}\nnot json\n')
    with pytest.raises(DatasetFormatError, match=r"bad\.jsonl:2: not a JSON object"):
        load_rows(bench, tmp_path / "bad.jsonl")


def test_missing_local_file_names_it_and_the_fix(tmp_path):
    missing = r"toy_greedy: data file .*nope\.jsonl does not exist.*commrl prepare"
    with pytest.raises(DatasetUnavailableError, match=missing):
        load_rows(get_benchmark("toy_greedy"), tmp_path / "nope.jsonl")
    with pytest.raises(DatasetUnavailableError, match=r"toy_avg8 reads a local file.*--data PATH"):
        load_rows(get_benchmark("toy_avg8"), None)


def test_uncached_hub_dataset_names_it_and_how_to_supply_it():
    """Offline (set in conftest) and not cached: the real ``datasets.load_dataset`` fails at once."""
    with pytest.raises(DatasetUnavailableError) as info:
        load_rows(get_benchmark("commrl_aime26"), None)
    message = str(info.value)
    assert "commrl_aime26" in message and "'MathArena/aime_2026'" in message and "split 'train'" in message
    assert "--data PATH" in message and "load_dataset('MathArena/aime_2026', split='train')" in message
