"""The benchmark registry, the task YAMLs generated from it (loaded by lm-eval itself) and pair settings."""

from __future__ import annotations

import re
from pathlib import Path

import lm_eval
import pytest
import yaml

from commrl.data.schema import format_prompt
from commrl.data.toy import TOY_TEMPLATE
from commrl.errors import ConfigError
from commrl.eval import BENCHMARKS, get_benchmark, pair_settings
from commrl.eval.benchmarks import AVG_K, GREEDY, MC, MMLU_STEM_SUBJECTS, Benchmark
from commrl.eval.lmeval_task import write_task_dir
from commrl.eval.problems import build_docs

LM_EVAL_TASKS = Path(lm_eval.__file__).parent / "tasks"
REPO = Path(__file__).resolve().parents[2]
TASK_LINE = re.compile(r"^\"?task\"?:\s*\"?([\w.-]+)\"?\s*$", re.MULTILINE)


def test_note_suite_kinds():
    """method.md §5: greedy mean@1 for MATH500, Minerva, OlympiadBench and MMLU-STEM (a letter, as
    Qwen2.5-Math's evaluation runs it); avg@8 at temperature 0.7 for AMC23 and the AIME sets."""
    kinds = {name: (b.kind, b.k, b.temperature) for name, b in BENCHMARKS.items()}
    greedy = ("commrl_math500", "commrl_minerva", "commrl_olympiadbench", "commrl_mmlu_stem", "toy_greedy")
    for name in greedy:
        assert kinds[name] == (GREEDY, 1, 0.0)
    for name in ("commrl_amc23", "commrl_aime24", "commrl_aime25", "commrl_aime26", "toy_avg8"):
        assert kinds[name] == (AVG_K, 8, 0.7)
    assert kinds["toy_mc"][0] == MC
    mmlu = BENCHMARKS["commrl_mmlu_stem"]
    assert mmlu.letter and (mmlu.hub.path, mmlu.hub.name, mmlu.hub.split) == ("cais/mmlu", "all", "test")
    assert mmlu.subjects == MMLU_STEM_SUBJECTS and not any(b.letter for b in BENCHMARKS.values() if b != mmlu)
    assert BENCHMARKS["commrl_olympiadbench"].hub.name == "OE_TO_maths_en_COMP"
    assert BENCHMARKS["commrl_minerva"].hub.path == "math-ai/minervamath"


def test_custom_names_do_not_shadow_builtins():
    """A task in the include path with a built-in's name would replace the built-in silently."""
    builtin = set()
    for path in LM_EVAL_TASKS.rglob("*.yaml"):
        builtin.update(TASK_LINE.findall(path.read_text(errors="ignore")))
    assert len(builtin) > 1000
    assert all(name.startswith(("commrl_", "toy_")) for name in BENCHMARKS)
    assert not set(BENCHMARKS) & builtin


def test_mmlu_stem_subjects_match_lm_eval():
    subjects = set()
    for path in (LM_EVAL_TASKS / "mmlu" / "default").glob("mmlu_*.yaml"):
        config = yaml.safe_load(path.read_text())
        if config.get("tag") == "mmlu_stem_tasks":
            subjects.add(config["dataset_name"])
    assert subjects == set(MMLU_STEM_SUBJECTS)


def test_unknown_benchmark_names_the_choices():
    with pytest.raises(ConfigError, match=r"unknown benchmark 'aime24'.*commrl_aime24"):
        get_benchmark("aime24")


def test_inconsistent_benchmark_is_rejected():
    with pytest.raises(ConfigError, match="avg@k needs k >= 2"):
        Benchmark("bad", AVG_K, k=1, temperature=0.7)
    with pytest.raises(ConfigError, match="one greedy pass"):
        Benchmark("bad", GREEDY, temperature=0.7)


@pytest.mark.parametrize("budget", [24, 3072])
def test_generation_settings_follow_the_budget_and_never_fix_a_seed(budget):
    for bench in BENCHMARKS.values():
        kwargs = bench.generation_kwargs(budget)
        if bench.kind == MC:
            assert kwargs is None
            continue
        assert kwargs["max_gen_toks"] == budget
        assert "seed" not in kwargs
        assert kwargs["do_sample"] is (bench.kind == AVG_K)
        assert kwargs["temperature"] == bench.temperature


def test_sampled_settings_truncate_nothing_on_the_hf_backend(tiny_model_dir, monkeypatch):
    """avg@k's settings as lm-eval's HFLM hands them to transformers ``generate`` (without ``until`` and
    ``max_gen_toks``, which it translates): no top-k or top-p warper runs (transformers' own default is
    top_k=50), so the hf backend samples the distribution vLLM and the rollouts sample."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.generation import logits_process

    calls: list[str] = []

    def recording(name: str):
        def call(self, input_ids, scores):
            calls.append(name)
            return scores

        return call

    for name in ("TopKLogitsWarper", "TopPLogitsWarper"):
        monkeypatch.setattr(getattr(logits_process, name), "__call__", recording(name))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    kwargs = get_benchmark("commrl_aime24").generation_kwargs(4)
    for key in ("until", "max_gen_toks"):
        kwargs.pop(key)
    model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, pad_token_id=0, **kwargs)
    assert calls == []
    kwargs.pop("top_k")  # the check itself: without it transformers truncates to its default 50
    model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, pad_token_id=0, **kwargs)
    assert "TopKLogitsWarper" in calls


def _load_task(tmp_path, name, rows, budget=64):
    from lm_eval.tasks import TaskManager

    bench = get_benchmark(name)
    yaml_path = write_task_dir(bench, build_docs(bench, rows, "rows"), budget, tmp_path / name)
    loaded = TaskManager(include_path=str(yaml_path.parent), include_defaults=False).load([name])
    return yaml_path, loaded["tasks"][name]


def test_generated_avg8_task_keeps_all_samples(tmp_path):
    rows = [{"problem": "12+30", "answer": "42"}, {"problem": "1+1", "answer": "2"}]
    yaml_path, task = _load_task(tmp_path, "toy_avg8", rows, budget=96)
    assert "!function 'commrl_scoring.process_avg_k'" in yaml_path.read_text()
    config = task.config
    assert config.repeats == 8
    assert config.filter_list == [{"name": "avg@8", "filter": [{"function": "take_first_k", "k": 8}]}]
    assert config.generation_kwargs["max_gen_toks"] == 96 and config.generation_kwargs["temperature"] == 0.7
    assert [m["metric"] for m in config.metric_list] == ["acc", "pass@8", "boxed"]
    docs = list(task.test_docs())
    assert [task.doc_to_text(d) for d in docs] == [format_prompt(TOY_TEMPLATE, p) for p in ("12+30", "1+1")]
    assert task.process_results(docs[0], [["\\boxed{42}", "\\boxed{41}", "42", "\\boxed{42.0}"]]) == {
        "acc": 0.5,
        "pass@4": 1.0,
        "boxed": 0.75,  # "42" has no box: the format, not the arithmetic, scored it 0
    }


def test_generated_greedy_and_mc_tasks(tmp_path):
    rows = [{"problem": "12+30", "answer": "42", "prompt": "from the data: 12+30"}]
    _, greedy = _load_task(tmp_path, "toy_greedy", rows)
    doc = next(iter(greedy.test_docs()))
    assert greedy.doc_to_text(doc) == "from the data: 12+30"
    assert greedy.config.repeats == 1 and greedy.config.generation_kwargs["do_sample"] is False
    assert greedy.process_results(doc, ["work... \\boxed{42}"]) == {"acc": 1.0, "boxed": 1.0}
    assert greedy.process_results(doc, ["42"]) == {"acc": 0.0, "boxed": 0.0}  # the answer must be boxed
    assert greedy.process_results(doc, ["work... \\boxed{41"]) == {"acc": 0.0, "boxed": 0.0}  # cut off
    _, mc = _load_task(tmp_path, "toy_mc", rows)
    doc = next(iter(mc.test_docs()))
    assert mc.config.output_type == "multiple_choice"
    assert mc.doc_to_choice(doc) == ["A", "B", "C", "D"]
    assert doc["choices"][mc.doc_to_target(doc)] == "42"


def mmlu_row(subject: str, question: str, answer: int) -> dict:
    """A row of ``cais/mmlu``'s ``all`` config (its columns: question, subject, choices, answer)."""
    return {"question": question, "subject": subject, "choices": ["1", "2", " 4 ", "8"], "answer": answer}


def test_generated_mmlu_stem_task_asks_a_chain_of_thought_and_reads_the_boxed_letter(tmp_path):
    """MMLU-STEM as Qwen2.5-Math's evaluation runs it (method.md §5: greedy mean@1): the STEM subjects' rows
    of ``cais/mmlu`` (``all``), the question with ``Answer Choices: (A) ... (D) ...`` in the pair's math
    prompt, greedy, and the letter in the last box, through lm-eval's loader of the generated task."""
    from commrl.data.schema import QWEN_MATH_TEMPLATE
    from commrl.eval.problems import of_subjects

    rows = [
        mmlu_row("high_school_mathematics", "2^2 = ?", 2),
        mmlu_row("philosophy", "Who wrote the Republic?", 0),  # not STEM: left out
        mmlu_row("college_physics", "How many legs?", 3),
    ]
    bench = get_benchmark("commrl_mmlu_stem")
    kept = of_subjects(rows, bench.subjects, "rows")
    assert [r["subject"] for r in kept] == ["high_school_mathematics", "college_physics"]
    yaml_path, task = _load_task(tmp_path, "commrl_mmlu_stem", kept, budget=256)
    assert "!function 'commrl_scoring.process_greedy_letter'" in yaml_path.read_text()
    assert task.config.output_type == "generate_until" and task.config.generation_kwargs["do_sample"] is False
    docs = list(task.test_docs())
    assert [d["answer"] for d in docs] == ["C", "D"]
    problem = "2^2 = ?\nAnswer Choices: (A) 1 (B) 2 (C) 4 (D) 8"
    assert task.doc_to_text(docs[0]) == format_prompt(QWEN_MATH_TEMPLATE, problem)
    for response, score in (
        ("4 is option C. \\boxed{C}", 1.0),
        ("\\boxed{(C)}", 1.0),
        ("\\boxed{\\text{C. } 4}", 1.0),
        ("the answer is C", 0.0),  # not boxed, as for every benchmark
        ("\\boxed{4}", 0.0),  # the option's value, not its letter
        ("\\boxed{D}", 0.0),
    ):
        assert task.process_results(docs[0], [response])["acc"] == score, response


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"question": "q", "subject": "anatomy", "choices": "ABCD", "answer": 0}, "choices must be a list"),
        ({"question": "q", "subject": "anatomy", "choices": ["1", "2"], "answer": 2}, "index (0 to 1)"),
        ({"question": "q", "subject": "anatomy", "choices": ["1", "2"], "answer": "C"}, "letter (A, B)"),
    ],
)
def test_a_malformed_multiple_choice_row_is_named(row, message):
    from commrl.eval.errors import DatasetFormatError

    with pytest.raises(DatasetFormatError, match=re.escape(message)):
        build_docs(get_benchmark("commrl_mmlu_stem"), [row], "mmlu.jsonl")


def test_mmlu_rows_without_their_subject_column_are_refused():
    from commrl.eval.errors import DatasetFormatError
    from commrl.eval.problems import of_subjects

    with pytest.raises(DatasetFormatError, match="no subject column to select abstract_algebra"):
        of_subjects([{"question": "q", "answer": 1}], MMLU_STEM_SUBJECTS, "mine.jsonl")
    with pytest.raises(DatasetFormatError, match="no row of the subjects"):
        of_subjects([mmlu_row("philosophy", "q", 0)], MMLU_STEM_SUBJECTS, "mine.jsonl")


def test_budgets_are_read_from_the_pair_configs():
    """The tiny pair's budget is sampler.max_new_tokens of configs/train/pair/tiny.yaml; a verl pair's is
    verl.data.max_response_length of configs/verl/pair/<pair>.yaml, its context prompt + response."""
    tiny = yaml.safe_load((REPO / "configs" / "train" / "pair" / "tiny.yaml").read_text())
    assert pair_settings("tiny").max_gen_toks == tiny["sampler"]["max_new_tokens"]
    for pair in ("A", "B"):
        data = yaml.safe_load((REPO / "configs" / "verl" / "pair" / f"{pair}.yaml").read_text())["verl"][
            "data"
        ]
        settings = pair_settings(pair)
        assert settings.max_gen_toks == data["max_response_length"]
        assert settings.max_model_len == data["max_prompt_length"] + data["max_response_length"]


def _pair_file(root: Path, tree: str, pair: str, edit=None) -> Path:
    """A copy of configs/<tree>/pair/<pair>.yaml under ``root``, changed by ``edit(data)``."""
    data = yaml.safe_load((REPO / "configs" / tree / "pair" / f"{pair}.yaml").read_text())
    if edit:
        edit(data)
    path = root / tree / "pair" / f"{pair}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_changing_a_pair_file_changes_the_eval_budget(tmp_path):
    _pair_file(tmp_path, "train", "tiny", lambda d: d["sampler"].update(max_new_tokens=40))
    _pair_file(tmp_path, "verl", "A", lambda d: d["verl"]["data"].update(max_response_length=1000))
    assert pair_settings("tiny", config_root=tmp_path).max_gen_toks == 40
    a = pair_settings("A", config_root=tmp_path)
    assert (a.max_gen_toks, a.max_model_len) == (1000, 2024)


def test_missing_pair_or_budget_is_named(tmp_path):
    _pair_file(tmp_path, "verl", "A")
    with pytest.raises(ConfigError, match=r"pair 'C' has no eval settings") as err:
        pair_settings("C", config_root=tmp_path)
    assert str(tmp_path / "verl" / "pair" / "C.yaml") in str(err.value)
    assert "(known pairs: A)" in str(err.value)
    _pair_file(tmp_path, "verl", "B", lambda d: d["verl"]["data"].pop("max_response_length"))
    with pytest.raises(ConfigError, match=r"B\.yaml has no integer verl\.data\.max_response_length"):
        pair_settings("B", config_root=tmp_path)


def test_pair_settings_layers_and_errors(tmp_path):
    assert (pair_settings("A").max_gen_toks, pair_settings("B").max_gen_toks) == (3072, 4096)
    config = tmp_path / "eval.yaml"
    config.write_text("max_gen_toks: 128\ntensor_parallel_size: 2\nsystem_prompt: Think.\n")
    settings = pair_settings("A", config, max_gen_toks=256)
    assert (settings.max_gen_toks, settings.tensor_parallel_size) == (256, 2)
    assert settings.system_prompt == "Think."
    with pytest.raises(ConfigError, match=r"'C' has no eval settings for max_gen_toks, max_model_len"):
        pair_settings("C")
    assert pair_settings("C", max_gen_toks=8, max_model_len=64).max_model_len == 64
    config.write_text("max_tokens: 128\n")
    with pytest.raises(ConfigError, match=r"unknown eval setting.*max_tokens"):
        pair_settings("A", config)
    with pytest.raises(ConfigError, match=r"max_gen_toks=4096 must be below eval\.max_model_len=4096"):
        pair_settings("A", max_gen_toks=4096)
    with pytest.raises(ConfigError, match=r"eval\.gpu_memory_utilization=1\.5"):
        pair_settings("A", gpu_memory_utilization=1.5)
