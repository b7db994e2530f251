"""Base-policy pretraining: batching, label noise, the exact-match stop check, determinism, the CLI.

The full recipe (landing in the accuracy window) is the slow test at the end.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from commrl.cli.main import main
from commrl.data.files import read_split, write_dataset
from commrl.data.toy import ToyConfig, prepare_toy
from commrl.models.pretrain import (
    ACCURACY_FILE,
    IGNORE_INDEX,
    PretrainConfig,
    activation_energy,
    exact_match_rate,
    generate,
    land_in_window,
    mean_reward,
    noisy_answer,
    pretrain,
    prompt_ids,
    response_budget,
    training_batch,
)
from commrl.models.tiny import TinyModelShape, build_char_tokenizer, build_tiny_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


@pytest.fixture(scope="module")
def small_toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small toy dataset whose prompts have different lengths (1- and 2-digit operands mixed)."""
    out = tmp_path_factory.mktemp("toy")
    write_dataset(
        out, prepare_toy(ToyConfig(digits=1, operators="+-*", n_train=120, n_validation=24, n_test=8))
    )
    return out


def test_training_batch_masks_prompt_and_padding() -> None:
    tok = build_char_tokenizer()
    prompts = [[5, 6, 7], [8, 9]]
    batch = training_batch(tok, prompts, ["\\boxed{1}", "\\boxed{123}"])
    response = [*tok.encode("\\boxed{123}", add_special_tokens=False), tok.eos_token_id]
    assert batch["input_ids"].shape == (2, 2 + len(response))
    assert batch["labels"][1].tolist() == [IGNORE_INDEX] * 2 + response
    assert batch["labels"][0].tolist()[:3] == [IGNORE_INDEX] * 3 and batch["labels"][0, -1] == IGNORE_INDEX
    assert batch["attention_mask"][0].tolist() == [1] * 13 + [0]
    assert batch["input_ids"][0, -1] == tok.pad_token_id


def test_label_noise_rate_and_offsets() -> None:
    rng = random.Random(0)
    answers = [noisy_answer("100", rng, 0.3, 20) for _ in range(4000)]
    wrong = [int(a) - 100 for a in answers if a != "100"]
    assert 0.27 < len(wrong) / len(answers) < 0.33
    assert all(1 <= abs(d) <= 20 for d in wrong) and min(wrong) < 0 < max(wrong)
    assert all(a == "100" for a in (noisy_answer("100", rng, 0.0, 20) for _ in range(100)))


def test_left_padded_batched_greedy_matches_one_by_one() -> None:
    tok = build_char_tokenizer()
    model = build_tiny_model(TinyModelShape(), tok, seed=1)
    texts = ["1+2=", "12+34=", "123*45+6=", "7-8=", "99+1="]
    prompts = prompt_ids(tok, [{"prompt": [{"role": "user", "content": t}]} for t in texts])
    batched = generate(model, tok, prompts, max_new_tokens=6, batch_size=5)
    single = [generate(model, tok, [p], max_new_tokens=6, batch_size=1)[0] for p in prompts]
    assert batched == single
    assert len({r[0] for r in batched}) > 1  # the prompts really steer the (random) model


def force_continuation(model: torch.nn.Module, tok: object, text: str) -> None:
    """Make greedy decoding after the assistant header write ``text`` then EOS: a forward hook adds +100 to
    the logit of the token that follows the current input token in ``text`` (its characters are distinct)."""
    ids = [*tok.encode("\n" + text, add_special_tokens=False), tok.eos_token_id]
    follow = torch.full((len(tok),), -1, dtype=torch.long)
    follow[torch.tensor(ids[:-1])] = torch.tensor(ids[1:])

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> object:
        nxt = follow[kwargs["input_ids"][:, -output.logits.shape[1] :]]  # generate keeps only the last logits
        boost = torch.zeros_like(output.logits)
        boost.scatter_(-1, nxt.clamp(min=0)[..., None], 100.0 * (nxt >= 0)[..., None].float())
        output.logits = output.logits + boost
        return output

    model.register_forward_hook(hook, with_kwargs=True)


def test_exact_match_equals_greedy_reproduction(small_toy: Path) -> None:
    tok = build_char_tokenizer()
    model = build_tiny_model(TinyModelShape(), tok, seed=2)
    force_continuation(model, tok, "\\boxed{7}")
    prompts = prompt_ids(tok, read_split(small_toy, "validation")[:8])
    assert generate(model, tok, prompts, max_new_tokens=16, batch_size=8) == [["\\boxed{7}"]] * 8
    assert exact_match_rate(model, tok, prompts, ["\\boxed{7}"] * 8, batch_size=3) == 1.0
    assert exact_match_rate(model, tok, prompts, ["\\boxed{7}", "\\boxed{8}"] * 4, batch_size=3) == 0.5
    assert exact_match_rate(model, tok, prompts, ["\\boxed{7"] * 8, batch_size=8) == 0.0  # EOS is part of it
    assert mean_reward([["\\boxed{7}"], ["\\boxed{8}"]], ["7", "7"]) == 0.5


def test_activation_energy_matches_direct_svd() -> None:
    tok = build_char_tokenizer()
    model = build_tiny_model(TinyModelShape(), tok, seed=4)
    texts = ["1+2=", "12+34=", "123*45+6="]
    prompts = prompt_ids(tok, [{"prompt": [{"role": "user", "content": t}]} for t in texts])
    responses = ["\\boxed{3}", "\\boxed{46}", "\\boxed{5541}"]
    shares = activation_energy(model, tok, prompts, responses, ranks=(1, 8, 128), batch_size=2)
    assert len(shares) == 4 and all(s[0] <= s[1] <= s[2] for s in shares)
    assert all(abs(s[2] - 1.0) < 1e-6 for s in shares)
    batch = training_batch(tok, prompts, responses)
    with torch.no_grad():
        hidden = model(**{k: batch[k] for k in ("input_ids", "attention_mask")}, output_hidden_states=True)
    a = hidden.hidden_states[1][batch["attention_mask"].bool()].double()  # output of decoder layer 0
    s2 = torch.linalg.svdvals(a) ** 2
    assert abs(shares[0][1] - float(s2[:8].sum() / s2.sum())) < 1e-4


def test_landing_bisects_between_checkpoints() -> None:
    model = torch.nn.Linear(3, 2)
    before = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    after = {k: torch.ones_like(v) for k, v in model.state_dict().items()}
    calls = []

    def check() -> float:  # a stand-in accuracy that grows linearly from before (0) to after (1)
        calls.append(float(model.weight.detach().mean()))
        return calls[-1]

    assert land_in_window(model, check, before, after, (0.40, 0.48), iterations=8) == (0.4375, 0.4375)
    assert calls == [0.5, 0.25, 0.375, 0.4375]
    assert torch.allclose(model.bias, torch.full((2,), 0.4375))
    alpha, acc = land_in_window(model, check, before, after, (0.401, 0.402), iterations=3)
    assert (alpha, acc) == (0.375, 0.375)  # out of iterations: the last point tried, outside the window


def test_pretrain_writes_loadable_dir_and_is_deterministic(small_toy: Path, tmp_path: Path) -> None:
    cfg = PretrainConfig(max_steps=3, batch_size=16, eval_every=1, target_acc=1.0, max_acc=1.0)
    a = pretrain(small_toy, tmp_path / "a", cfg)
    b = pretrain(small_toy, tmp_path / "b", cfg)
    weights = [hashlib.sha256((tmp_path / d / "model.safetensors").read_bytes()).hexdigest() for d in "ab"]
    assert weights[0] == weights[1]
    saved = json.loads((tmp_path / "a" / ACCURACY_FILE).read_text())
    for key in ("greedy_acc", "pass_rate_t1", "steps", "seconds", "seed"):
        assert key in saved
    assert saved["steps"] == 3 and not saved["in_window"] and len(saved["history"]) == 3
    assert (a["greedy_acc"], a["pass_rate_t1"]) == (b["greedy_acc"], b["pass_rate_t1"])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    tok = AutoTokenizer.from_pretrained(tmp_path / "a")
    assert model.config.hidden_size == 128 and tok.eos_token == "<|im_end|>"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_pretrain_cli_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pretrain", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "m")]) == 2
    assert "commrl prepare" in capsys.readouterr().err
    dsr = tmp_path / "dsr"
    source = str(FIXTURES / "deepscaler" / "deepscaler.json")
    exclude = str(FIXTURES / "math500" / "test.jsonl")
    argv = ["prepare", "--dataset", "deepscaler", "--source", source, "--exclude", exclude, "--out", str(dsr)]
    assert main(argv) == 0
    shutil.copy(dsr / "train.parquet", dsr / "validation.parquet")
    assert main(["pretrain", "--data", str(dsr), "--out", str(tmp_path / "m")]) == 2
    assert "row 2 has ground truth '\\\\frac{1}{4}', not an integer" in capsys.readouterr().err
    assert main(["pretrain", "--data", str(dsr), "--out", str(tmp_path / "m"), "--label-noise", "1.5"]) == 2
    assert "pretrain.label_noise=1.5 must be in [0, 1)" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_base_policy_lands_in_accuracy_window(tmp_path: Path) -> None:
    """The default recipe, end to end through the CLI: greedy validation accuracy in [0.25, 0.50] and a
    T=1 pass rate in [0.15, 0.45]; the saved directory reproduces the greedy accuracy after reloading."""
    data, out = tmp_path / "toy", tmp_path / "base"
    assert main(["prepare", "--dataset", "toy", "--out", str(data)]) == 0
    assert main(["pretrain", "--data", str(data), "--out", str(out)]) == 0
    acc = json.loads((out / ACCURACY_FILE).read_text())
    assert 0.25 <= acc["greedy_acc"] <= 0.50, acc
    assert 0.15 <= acc["pass_rate_t1"] <= 0.45, acc
    assert abs(acc["greedy_acc"] - acc["greedy_exact_match"]) <= 0.02  # the stop check is greedy exact match

    model, tok = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    answers = [r["reward_model"]["ground_truth"] for r in read_split(data, "validation")]
    prompts = prompt_ids(tok, read_split(data, "validation"))
    responses = generate(model, tok, prompts, max_new_tokens=response_budget(answers), batch_size=512)
    assert mean_reward(responses, answers) == acc["greedy_acc"]
