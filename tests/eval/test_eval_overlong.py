"""A prompt past the context: lm-eval cuts it from the left and only warns; the evaluation counts it, says
so, and records the count (the real tiny model on the hf backend, the contexts lm-eval sent)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from eval_data import toy_rows, write_jsonl

from commrl.eval import evaluate_checkpoint
from commrl.eval.overlong import checkpoint_tokenizer, count_overlong
from commrl.eval.pairs import pair_settings


def test_an_overlong_prompt_is_counted_and_reported(tiny_model_dir, tmp_path, capsys):
    settings = pair_settings("tiny")
    budget = settings.max_model_len - settings.max_gen_toks
    rows = toy_rows(2)
    rows[1]["prompt"] = "1+" * budget + "1="  # one character a token: past the budget
    data = write_jsonl(tmp_path / "test.jsonl", rows)
    summary = evaluate_checkpoint(
        tiny_model_dir, "toy_greedy", backend="hf", out=tmp_path / "g.json", data=data, log_to_mlflow=False
    )
    assert summary["overlong_prompts"] == 1 and summary["n_docs"] == 2
    assert "toy_greedy: 1 of 2 prompts exceed the context (max_model_len 512" in capsys.readouterr().err


def test_the_budget_of_a_generated_answer_and_of_a_multiple_choice_option():
    def tokenizer(text, add_special_tokens):
        return {"input_ids": list(text)}

    generated = {"t": [{"arguments": [["x" * 6, {"max_gen_toks": 4}]]}]}
    assert count_overlong(generated, tokenizer, max_model_len=10, max_gen_toks=4) == 0
    assert count_overlong(generated, tokenizer, max_model_len=9, max_gen_toks=4) == 1
    options = {"t": [{"arguments": [["x" * 6, "yyy"], ["x" * 6, "y"]]}]}
    assert count_overlong(options, tokenizer, max_model_len=9, max_gen_toks=None) == 0
    assert count_overlong(options, tokenizer, max_model_len=8, max_gen_toks=None) == 1


def test_one_checkpoint_tokenizer_serves_all_its_benchmarks(tiny_model_dir, tmp_path):
    ckpt = Path(shutil.copytree(tiny_model_dir, tmp_path / "ckpt"))
    first = checkpoint_tokenizer(ckpt)
    assert checkpoint_tokenizer(ckpt) is first
    config = ckpt / "tokenizer_config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    assert checkpoint_tokenizer(ckpt) is not first
