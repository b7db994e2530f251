"""The toy arithmetic task: determinism, disjoint splits, verifiable answers, the verl schema on disk."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from commrl.cli.main import main
from commrl.data.schema import DataError
from commrl.data.toy import DATA_SOURCE, ToyConfig, evaluate, generate_toy, problem_space_size, toy_response
from commrl.rl.reward import boxed_reward

SMALL = ToyConfig(n_train=300, n_validation=60, n_test=60)


def problems(splits: dict[str, list[dict]]) -> dict[str, list[str]]:
    return {s: [r["extra_info"]["problem"] for r in rows] for s, rows in splits.items()}


def test_deterministic_by_seed_and_disjoint() -> None:
    a, b, c = (
        generate_toy(SMALL),
        generate_toy(SMALL),
        generate_toy(replace(SMALL, seed=1)),
    )
    assert a == b
    assert problems(a) != problems(c)
    p = problems(a)
    assert [len(p[s]) for s in ("train", "validation", "test")] == [300, 60, 60]
    sets = {s: set(v) for s, v in p.items()}
    assert sum(len(v) for v in sets.values()) == 420  # no duplicates inside a split either
    assert not sets["train"] & sets["validation"] and not sets["train"] & sets["test"]
    assert not sets["validation"] & sets["test"]


def test_near_exhaustive_draw_stays_disjoint() -> None:
    cfg = ToyConfig(digits=1, n_operands=2, operators="+-", n_train=150, n_validation=25, n_test=25)
    assert problem_space_size(cfg) == 200
    p = problems(generate_toy(cfg))
    assert len(set(p["train"]) | set(p["validation"]) | set(p["test"])) == 200


def test_answers_verify_and_perturbed_do_not() -> None:
    cfg = ToyConfig(operators="+-*", n_operands=3, n_train=40, n_validation=10, n_test=10)
    for rows in generate_toy(cfg).values():
        for row in rows:
            truth = row["reward_model"]["ground_truth"]
            assert int(truth) == eval(row["extra_info"]["problem"])  # independent oracle: digits and +-* only
            assert boxed_reward(toy_response(truth), truth) == 1.0
            assert boxed_reward(toy_response(str(int(truth) + 1)), truth) == 0.0
            assert boxed_reward(truth, truth) == 0.0  # an answer outside \boxed{} does not count


def test_precedence() -> None:
    assert evaluate((2, 3, 4), ("+", "*")) == 14
    assert evaluate((2, 3, 4), ("*", "-")) == 2
    assert evaluate((10, 3, 4, 5), ("-", "-", "*")) == -13


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("digits", 0, r"toy.digits=0 must be in 1..9"),
        ("operators", "+/", r"toy.operators='\+/'"),
        ("n_operands", 1, r"toy.n_operands=1"),
        ("n_train", 9000, r"exceeds the 8100 distinct problems"),
        ("prompt_template", "no placeholder", r"no \{problem\} placeholder"),
    ],
)
def test_bad_config_names_the_field(field: str, value: object, match: str) -> None:
    with pytest.raises(DataError, match=match):
        ToyConfig(**{field: value}).validate()


def test_cli_writes_verl_parquet_jsonl_and_manifest(tmp_path: Path) -> None:
    out = tmp_path / "toy"
    args = [
        "prepare",
        "--dataset",
        "toy",
        "--out",
        str(out),
        "--n-train",
        "200",
        "--n-val",
        "30",
        "--n-test",
        "20",
    ]
    assert main(args) == 0
    first = json.loads((out / "manifest.json").read_text())
    assert {"train.parquet", "validation.parquet", "validation.jsonl", "test.parquet", "test.jsonl"} == set(
        first["outputs"]
    )
    train = pq.read_table(out / "train.parquet").to_pylist()
    assert len(train) == 200 and train[0]["data_source"] == DATA_SOURCE and train[0]["ability"] == "math"
    assert train[0]["prompt"] == [{"role": "user", "content": train[0]["extra_info"]["problem"] + "="}]
    assert train[0]["reward_model"]["style"] == "rule"
    test = [json.loads(x) for x in (out / "test.jsonl").read_text().splitlines()]
    assert len(test) == 20 and set(test[0]) == {"problem", "answer", "prompt"}
    assert first["toy_config"]["n_train"] == 200 and first["prompt_template"] == "{problem}="

    assert main(args) == 0  # same seed, same bytes
    second = json.loads((out / "manifest.json").read_text())
    assert {k: v["sha256"] for k, v in first["outputs"].items()} == {
        k: v["sha256"] for k, v in second["outputs"].items()
    }
    assert main([*args, "--source", "x"]) == 2


def test_verl_rlhf_dataset_reads_the_parquet(tmp_path: Path) -> None:
    """verl's own dataset class loads the toy parquet with the tiny tokenizer, as the cluster driver will."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from commrl.models.tiny import build_char_tokenizer

    out = tmp_path / "toy"
    assert main(["prepare", "--dataset", "toy", "--out", str(out), "--n-train", "50", "--n-val", "9"]) == 0
    config = {
        "prompt_key": "prompt",
        "max_prompt_length": 32,
        "filter_overlong_prompts": True,
        "filter_overlong_prompts_workers": 1,
        "cache_dir": str(tmp_path / "cache"),
    }
    ds = RLHFDataset([str(out / "validation.parquet")], build_char_tokenizer(), OmegaConf.create(config))
    assert len(ds) == 9  # no prompt is over the length limit
    item = ds[3]
    assert item["raw_prompt"] == [{"role": "user", "content": item["extra_info"]["problem"] + "="}]
    assert item["index"] == 3 and item["data_source"] == DATA_SOURCE
    assert boxed_reward(
        toy_response(item["reward_model"]["ground_truth"]), item["reward_model"]["ground_truth"]
    )
