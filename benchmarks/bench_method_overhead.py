"""Tick overhead of the method's fast circuit against a dense step, as a ratio measured in one run.

One step = zero_grad, forward, backward, AdamW step. The method's step adds the activation codec on every
decoder layer, PowerSGD with error feedback and the sign correction (after one anchor fire, so the dense
memory exists). Dense and method steps are interleaved and the median of the per-repetition ratios is
reported (target <= 1.25x) with its 95% interval (the order statistics of
``commrl.report.stats.median_interval``, from 6 repetitions). Two shapes:

- ``tiny``: the embedded default's policy (TinyModelShape: hidden 128, 4 layers), rank 16;
- ``qwen15b-layer``: one Qwen2.5-1.5B-shaped decoder layer (hidden 1536, MLP 8960, 12 heads / 2 KV heads),
  a 512-token vocabulary so that the layer dominates, rank 77 (the paper's).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_method_overhead.py [--reps 5] [--case tiny]
        [--out result.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from lockstep import interval_text
from tqdm import tqdm
from transformers import Qwen2Config, Qwen2ForCausalLM

from commrl.compression import MethodConfig, TwoCircuitController
from commrl.models.tiny import TinyModelShape
from commrl.report.stats import median_interval


@dataclass(frozen=True)
class Case:
    name: str
    config: Qwen2Config
    rank: int
    batch: int
    length: int


CASES = ("tiny", "qwen15b-layer")


def cases(layer_tokens: int) -> list[Case]:
    tiny = TinyModelShape()
    tiny_config = Qwen2Config(vocab_size=259, tie_word_embeddings=False, **asdict(tiny))
    layer_config = Qwen2Config(
        vocab_size=512,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=1,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    return [
        Case(CASES[0], tiny_config, rank=16, batch=16, length=64),
        Case(CASES[1], layer_config, rank=77, batch=1, length=layer_tokens),
    ]


def make_step(model: torch.nn.Module, ctrl: TwoCircuitController | None, ids: torch.Tensor):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def loss() -> torch.Tensor:
        logits = model(input_ids=ids).logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        if ctrl is None:
            loss().backward()
        else:
            with ctrl.compressed(microbatch_id=0):
                loss().backward()
            ctrl.compress_gradients()
        opt.step()
        if ctrl is not None:
            ctrl.end_tick()

    if ctrl is not None:  # the fire at t = 0: dense memory and refreshed bases exist from here on

        def replay() -> None:
            opt.zero_grad()
            loss().backward()

        ctrl.fire(replay)
        opt.step()
        ctrl.end_tick()
    return step


def measure(case: Case, reps: int) -> dict:
    torch.manual_seed(0)
    dense_model = Qwen2ForCausalLM(case.config).float()
    method_model = copy.deepcopy(dense_model)
    cfg = MethodConfig(rank=case.rank, cadence=1_000_000, grad_cosine_every=0)  # the fire is only set-up here
    ctrl = TwoCircuitController(method_model, cfg)
    ids = torch.randint(0, case.config.vocab_size, (case.batch, case.length))
    dense_step, method_step = make_step(dense_model, None, ids), make_step(method_model, ctrl, ids)
    dense_step()  # warm-up (allocations, first-call kernels)
    method_step()
    dense_s, method_s = [], []
    for _ in tqdm(range(reps), desc=case.name, unit="rep"):
        for step, times in ((dense_step, dense_s), (method_step, method_s)):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    ratios = [m / d for m, d in zip(method_s, dense_s, strict=True)]
    median = median_interval(ratios)
    return {
        "case": case.name,
        "tokens_per_step": case.batch * case.length,
        "rank": case.rank,
        "parameters": sum(p.numel() for p in dense_model.parameters()),
        "dense_s_median": statistics.median(dense_s),
        "method_s_median": statistics.median(method_s),
        "ratio_median": median.estimate,
        "ratio_low": median.low,
        "ratio_high": median.high,
        "ratios": ratios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="interleaved dense/method repetitions per case")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--layer-tokens", type=int, default=1024, help="tokens per step for the 1.5B layer")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--case", choices=CASES, action="append", help="only this case (default: both)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    chosen = [case for case in cases(args.layer_tokens) if case.name in (args.case or CASES)]
    results = [measure(case, args.reps) for case in chosen]
    print(
        f"{'case':<15} {'tokens':>7} {'rank':>5} {'dense s':>9} {'method s':>9} {'median ratio':>13} "
        f"{'95% interval':>16}"
    )
    for r in results:
        print(
            f"{r['case']:<15} {r['tokens_per_step']:>7} {r['rank']:>5} {r['dense_s_median']:>9.4f} "
            f"{r['method_s_median']:>9.4f} {r['ratio_median']:>12.3f}x "
            f"{interval_text(r['ratio_low'], r['ratio_high']):>16}"
        )
    if args.out:
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(json.dumps(results, indent=2))
        tmp.replace(args.out)


if __name__ == "__main__":
    main()
