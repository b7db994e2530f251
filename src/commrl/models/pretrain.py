"""Base-policy pretraining: a short supervised run that leaves the tiny model partly right.

The tiny model learns the chat format and the toy task from the train split (prompt -> ``\\boxed{answer}``),
with a fraction ``label_noise`` of the targets deliberately wrong (the true answer plus a nonzero offset of
at most ``noise_max_offset``, drawn afresh at every use). Every ``eval_every`` steps the greedy accuracy on
the validation split is checked; training stops once it lies in ``[target_acc, max_acc]``. A check that
jumps past ``max_acc`` is landed by bisecting between the last two checkpoints (``land_in_window``). The
base policy thus starts where the note's base model does (greedy accuracy about 0.35 to 0.45) while
sampling at temperature 1 still yields groups with mixed rewards for GRPO. Deterministic by seed.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

from commrl.data.files import read_split
from commrl.data.schema import DataError
from commrl.data.toy import toy_response
from commrl.errors import ConfigError
from commrl.models.tiny import TinyModelShape, build_char_tokenizer, build_tiny_model, save_model_dir
from commrl.rl.reward import boxed_reward
from commrl.staging import staged_dir

ACCURACY_FILE = "base_accuracy.json"
IGNORE_INDEX = -100
ENERGY_RANKS = (4, 8, 16)


@dataclass(frozen=True)
class PretrainConfig:
    """Recipe of the base-policy pretraining.

    Starts from the field note ``tinyworld.md`` (AdamW 1e-3, stop near 0.42). Batch 64 reaches the window
    with fewer samples than 128, and 10% label noise (not 30%) keeps the T=1 pass rate near 0.2 at greedy
    accuracy 0.4-0.48 (30% leaves it near 0.12). Seed 0: 240 steps, greedy 0.436, pass rate 0.215.
    """

    seed: int = 0
    max_steps: int = 2000
    target_acc: float = 0.40
    max_acc: float = 0.48
    landing_iterations: int = 8
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    label_noise: float = 0.1
    noise_max_offset: int = 20
    eval_every: int = 10
    eval_batch_size: int = 512
    pass_samples: int = 2

    def validate(self) -> PretrainConfig:
        """Raise ``ConfigError`` naming the bad field and its allowed range; return self."""
        rules = {
            "max_steps": (self.max_steps >= 1, ">= 1"),
            "target_acc": (0.0 < self.target_acc <= 1.0, "in (0, 1]"),
            "batch_size": (self.batch_size >= 1, ">= 1"),
            "lr": (self.lr > 0, "> 0"),
            "warmup_steps": (self.warmup_steps >= 0, ">= 0"),
            "max_acc": (self.target_acc <= self.max_acc <= 1.0, f"in [target_acc={self.target_acc}, 1]"),
            "landing_iterations": (self.landing_iterations >= 1, ">= 1"),
            "weight_decay": (self.weight_decay >= 0, ">= 0"),
            "grad_clip": (self.grad_clip > 0, "> 0"),
            "label_noise": (0.0 <= self.label_noise < 1.0, "in [0, 1)"),
            "noise_max_offset": (self.noise_max_offset >= 1, ">= 1"),
            "eval_every": (self.eval_every >= 1, ">= 1"),
            "eval_batch_size": (self.eval_batch_size >= 1, ">= 1"),
            "pass_samples": (self.pass_samples >= 1, ">= 1"),
        }
        for name, (ok, rule) in rules.items():
            if not ok:
                raise ConfigError(f"pretrain.{name}={getattr(self, name)!r} must be {rule}")
        return self


def prompt_ids(tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict[str, Any]]) -> list[list[int]]:
    """Chat-formatted prompt token ids (with the assistant header) of each verl row."""
    return [
        list(
            tokenizer.apply_chat_template(
                row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for row in rows
    ]


def noisy_answer(answer: str, rng: random.Random, label_noise: float, max_offset: int) -> str:
    """``answer`` with probability ``1 - label_noise``, else ``answer ± k`` (k uniform in 1..max_offset)."""
    if rng.random() >= label_noise:
        return answer
    offset = rng.randint(1, max_offset) * rng.choice((-1, 1))
    return str(int(answer) + offset)


def training_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[list[int]], responses: Sequence[str]
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (loss on the response and EOS only)."""
    seqs, labels = [], []
    for p, response in zip(prompts, responses, strict=True):
        r = [*tokenizer.encode(response, add_special_tokens=False), tokenizer.eos_token_id]
        seqs.append(p + r)
        labels.append([IGNORE_INDEX] * len(p) + r)
    width = max(len(s) for s in seqs)
    pad = tokenizer.pad_token_id
    return {
        "input_ids": torch.tensor([s + [pad] * (width - len(s)) for s in seqs]),
        "attention_mask": torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs]),
        "labels": torch.tensor([lab + [IGNORE_INDEX] * (width - len(lab)) for lab in labels]),
    }


@torch.no_grad()
def exact_match_rate(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[int]],
    responses: Sequence[str],
    batch_size: int,
) -> float:
    """Fraction of prompts whose greedy decoding is exactly ``response`` + EOS, in teacher-forced passes.

    Greedy decoding reproduces the target iff every target token is the argmax given the tokens before
    it, so one batched forward pass per chunk gives greedy exact match without decoding token by token.
    """
    was_training = model.training
    model.eval()
    hits = 0
    for start in range(0, len(prompts), batch_size):
        batch = training_batch(
            tokenizer, prompts[start : start + batch_size], responses[start : start + batch_size]
        )
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        labels = batch["labels"][:, 1:]
        correct = (logits[:, :-1].argmax(-1) == labels) | (labels == IGNORE_INDEX)
        hits += int(correct.all(dim=1).sum())
    model.train(was_training)
    return hits / len(prompts)


@torch.no_grad()
def generate(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[int]],
    *,
    max_new_tokens: int,
    batch_size: int,
    temperature: float = 0.0,
    num_samples: int = 1,
) -> list[list[str]]:
    """Responses per prompt, in batches with left padding; greedy when ``temperature == 0``."""
    was_training = model.training
    model.eval()
    out: list[list[str]] = []
    sampling = {"temperature": temperature, "top_p": 1.0, "top_k": 0} if temperature > 0 else {}
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(len(p) for p in chunk)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        gen = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            num_return_sequences=num_samples,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=pad,
            **sampling,
        )
        texts = tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
        out.extend(texts[i : i + num_samples] for i in range(0, len(texts), num_samples))
    model.train(was_training)
    return out


@torch.no_grad()
def activation_energy(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[int]],
    responses: Sequence[str],
    ranks: Sequence[int] = ENERGY_RANKS,
    batch_size: int = 512,
) -> list[list[float]]:
    """Per decoder layer, the share of the output activations' energy in their top-``r`` directions.

    ``sum_{i<=r} s_i^2 / sum_i s_i^2`` with ``s_i`` the singular values of the layer-output matrix ``A``
    (non-padding tokens of prompt + response, uncentred, as the low-rank codec ``A Q Q^T`` sees it;
    method.md §2). Near 1 at small ``r`` means a concentrated spectrum, where the codec loses little.
    """
    layers = model.model.layers
    grams = [
        torch.zeros(model.config.hidden_size, model.config.hidden_size, dtype=torch.float64) for _ in layers
    ]
    mask: torch.Tensor | None = None

    def accumulate(i: int):
        def hook(module: torch.nn.Module, args: tuple, output: object) -> None:
            h = output[0] if isinstance(output, tuple) else output
            a = h[mask.bool()].double()
            grams[i] += a.T @ a

        return hook

    handles = [layer.register_forward_hook(accumulate(i)) for i, layer in enumerate(layers)]
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(prompts), batch_size):
            batch = training_batch(
                tokenizer, prompts[start : start + batch_size], responses[start : start + batch_size]
            )
            mask = batch["attention_mask"]
            model(input_ids=batch["input_ids"], attention_mask=mask)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    shares = []
    for gram in grams:
        eig = torch.linalg.eigvalsh(gram).flip(0).clamp(min=0)
        shares.append([round(float(eig[:r].sum() / eig.sum()), 4) for r in ranks])
    return shares


def response_budget(answers: Sequence[str], slack: int = 8) -> int:
    """New-token budget for evaluation: the longest ideal response (one token per character) plus slack."""
    return max(len(toy_response(a)) for a in answers) + slack


def mean_reward(responses: Sequence[Sequence[str]], ground_truths: Sequence[str]) -> float:
    """Mean ``boxed_reward`` over all responses (one list of samples per prompt)."""
    scores = [boxed_reward(r, gt) for rs, gt in zip(responses, ground_truths, strict=True) for r in rs]
    return sum(scores) / len(scores)


def learning_rate(cfg: PretrainConfig, step: int) -> float:
    """``cfg.lr`` after a linear warmup over ``cfg.warmup_steps``."""
    return cfg.lr * min(1.0, (step + 1) / (cfg.warmup_steps + 1))


def clone_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def interpolate_(
    model: torch.nn.Module, start: dict[str, torch.Tensor], end: dict[str, torch.Tensor], alpha: float
) -> None:
    """Set the model's weights in place to ``(1 - alpha) * start + alpha * end``."""
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(torch.lerp(start[name], end[name], alpha))


def land_in_window(
    model: torch.nn.Module,
    check: Callable[[], float],
    before: dict[str, torch.Tensor],
    after: dict[str, torch.Tensor],
    window: tuple[float, float],
    iterations: int,
) -> tuple[float, float]:
    """Bisect ``alpha`` in ``interpolate_(model, before, after, alpha)`` until ``check()`` lies in ``window``.

    Greedy exact match moves in jumps (many problems' argmax margins flip together), so one check interval
    can carry it from below the window to above it; ``before`` is the last checkpoint below the window and
    ``after`` the first above it. Returns ``(alpha, accuracy)`` of the last point tried (the model is left
    there), inside the window unless ``iterations`` ran out.
    """
    lo, hi = 0.0, 1.0
    alpha, acc = 1.0, float("nan")
    for _ in range(iterations):
        alpha = (lo + hi) / 2
        interpolate_(model, before, after, alpha)
        acc = check()
        if acc < window[0]:
            lo = alpha
        elif acc > window[1]:
            hi = alpha
        else:
            break
    return alpha, acc


def integer_answers(rows: Sequence[dict[str, Any]], where: str) -> list[str]:
    """The rows' ground truths, which must be integers (the toy task) for the label noise to apply."""
    answers = [str(row["reward_model"]["ground_truth"]) for row in rows]
    for i, answer in enumerate(answers):
        try:
            int(answer)
        except ValueError:
            raise DataError(
                f"{where} row {i} has ground truth {answer!r}, not an integer; the base policy is pretrained "
                "on the toy task: point --data at a `commrl prepare --dataset toy` directory"
            ) from None
    return answers


def pretrain(
    data_dir: str | Path, out_dir: str | Path, cfg: PretrainConfig = PretrainConfig()
) -> dict[str, Any]:
    """Pretrain the tiny base policy on ``data_dir``'s toy train split and save it to ``out_dir``.

    Stops once greedy validation exact match lies in ``[cfg.target_acc, cfg.max_acc]`` (landing a jump past
    it). Returns (and writes to ``out_dir/base_accuracy.json``) the greedy validation accuracy and the T=1
    pass rate (both scored with ``boxed_reward`` on generated responses), steps, seconds, seed, the
    activation-energy diagnostic, the recipe and the learning curve.
    """
    cfg.validate()
    train, val = read_split(data_dir, "train"), read_split(data_dir, "validation")
    train_answers = integer_answers(train, f"{data_dir}/train.parquet")
    val_answers = integer_answers(val, f"{data_dir}/validation.parquet")
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyModelShape(), tokenizer, seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    train_prompts, val_prompts = prompt_ids(tokenizer, train), prompt_ids(tokenizer, val)
    val_targets = [toy_response(a) for a in val_answers]
    max_new_tokens = response_budget(val_answers)

    def check() -> float:
        return exact_match_rate(model, tokenizer, val_prompts, val_targets, cfg.eval_batch_size)

    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    model.train()
    wall, cpu = time.perf_counter(), time.process_time()
    step, match, history = 0, 0.0, []
    before = clone_state(model)
    with tqdm(total=cfg.max_steps, desc="pretrain", unit="step") as bar:
        while step < cfg.max_steps and match < cfg.target_acc:
            idx = [rng.randrange(len(train)) for _ in range(cfg.batch_size)]
            targets = [
                toy_response(noisy_answer(train_answers[i], rng, cfg.label_noise, cfg.noise_max_offset))
                for i in idx
            ]
            loss = model(**training_batch(tokenizer, [train_prompts[i] for i in idx], targets)).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(cfg, step)
            optimizer.step()
            step += 1
            bar.update(1)
            if step % cfg.eval_every == 0 or step == cfg.max_steps:
                match = check()
                history.append({"step": step, "loss": round(loss.item(), 4), "greedy_exact_match": match})
                bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{match:.3f}")
                if match > cfg.max_acc:
                    window = (cfg.target_acc, cfg.max_acc)
                    alpha, match = land_in_window(
                        model, check, before, clone_state(model), window, cfg.landing_iterations
                    )
                    history.append({"step": step, "landing_alpha": alpha, "greedy_exact_match": match})
                elif match < cfg.target_acc:
                    before = clone_state(model)
    train_seconds = time.perf_counter() - wall

    greedy = generate(
        model, tokenizer, val_prompts, max_new_tokens=max_new_tokens, batch_size=cfg.eval_batch_size
    )
    torch.manual_seed(cfg.seed)
    samples = generate(
        model,
        tokenizer,
        val_prompts,
        max_new_tokens=max_new_tokens,
        batch_size=cfg.eval_batch_size,
        temperature=1.0,
        num_samples=cfg.pass_samples,
    )
    result = {
        "greedy_acc": mean_reward(greedy, val_answers),
        "pass_rate_t1": mean_reward(samples, val_answers),
        "greedy_exact_match": match,
        "in_window": cfg.target_acc <= match <= cfg.max_acc,
        "activation_energy": {
            "ranks": list(ENERGY_RANKS),
            "per_layer": activation_energy(
                model, tokenizer, val_prompts, val_targets, batch_size=cfg.eval_batch_size
            ),
        },
        "steps": step,
        "seconds": round(time.perf_counter() - wall, 2),
        "train_seconds": round(train_seconds, 2),
        "cpu_seconds": round(time.process_time() - cpu, 2),
        "torch_threads": torch.get_num_threads(),
        "seed": cfg.seed,
        "eval_split": "validation",
        "eval_prompts": len(val),
        "data": str(Path(data_dir).resolve()),
        "config": asdict(cfg),
        "history": history,
    }
    with staged_dir(out_dir) as stage:
        save_model_dir(model, tokenizer, stage)
        (stage / ACCURACY_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result
