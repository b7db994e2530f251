"""What a trainer pass of the tiny pair is made of, and what the obvious speed-ups of it would buy.

One dense tick's passes (the reference forward and the policy's forward+backward over 128 sequences, as
`commrl train` runs them: shared-prefix packing, one thread) on one sampled batch, in arms interleaved
repetition by repetition; each arm's median, and its ratio to the trainer's own setting (`default`):

- `mb32`, `mb128`: other micro-batch sizes (the tiny pair's is 64);
- `compile`: each decoder layer `torch.compile(dynamic=True)`d (Inductor's fused CPU kernels), on a copy of
  the policy; its compile seconds (cold, or warm from Inductor's on-disk cache) are printed apart, as a
  training job would pay them once;
- `bf16`: copies of the policy and the reference in bfloat16 (what a lower precision would buy; it would
  change every number).

Each arm's ratio to `default` is the median of the repetitions' ratios, with its 95% interval from 6
repetitions (`commrl.report.stats.median_interval`).

Then the eager pass's share of matrix products (`aten::mm`/`addmm`/`bmm`, torch.profiler) and their rate,
against the same products timed alone: how much of a pass anything but faster arithmetic could remove. And
one tick's sampling (the HF sampler, 16 prompts x 8): the share inside the model's forward calls, and of
that the KV cache's updates (transformers' ``DynamicLayer.update``, a copy of the cache at every step); and
the same sampling with the sampler's weights in bfloat16.

    .venv/bin/python benchmarks/bench_passes.py [--repeat 7] [--no-compile]

Needs the tiny base model and the toy data:
`snakemake --cores 2 results/models/tiny-base/base_accuracy.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import torch
from lockstep import interval_text
from torch._inductor.runtime.cache_dir_utils import cache_dir

from commrl.report.stats import median_interval
from commrl.rl import grpo
from commrl.rl.batch import micro_batches
from commrl.rl.config import load_train_config
from commrl.rl.trainer import LocalTrainer

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")


def dense_tick_passes(trainer: LocalTrainer, batch, adv: torch.Tensor) -> None:
    """A dense tick's passes, by the trainer's own code: the reference forward (``_log_probs``) and the
    policy's forward+backward of the GRPO loss (``_dense_replay``, the anchor's dense pass: ratio one, no
    optimizer step), in micro-batches of ``trainer.micro``."""
    ref = trainer._log_probs(trainer.ref, batch, "plain")
    trainer.model.zero_grad(set_to_none=True)
    trainer._dense_replay(batch, adv, ref, None)()


@contextlib.contextmanager
def arm(
    trainer: LocalTrainer,
    micro: int | None = None,
    model: torch.nn.Module | None = None,
    ref: torch.nn.Module | None = None,
) -> Iterator[None]:
    """The trainer with another micro-batch size, policy or reference for the duration of one call."""
    saved = trainer.micro, trainer.model, trainer.ref
    trainer.micro = saved[0] if micro is None else micro
    trainer.model = saved[1] if model is None else model
    trainer.ref = saved[2] if ref is None else ref
    try:
        yield
    finally:
        trainer.micro, trainer.model, trainer.ref = saved


def passes(trainer: LocalTrainer, batch, adv: torch.Tensor, **swap) -> Callable[[], None]:
    """``dense_tick_passes`` under ``arm(trainer, **swap)``, as a callable to time."""

    def run() -> None:
        with arm(trainer, **swap):
            dense_tick_passes(trainer, batch, adv)

    return run


def seconds(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def matmul_profile(fn: Callable[[], None]) -> tuple[float, float, float]:
    """(matmul seconds, all op seconds, matmul GFLOP) of one call of ``fn``, from torch.profiler."""
    with torch.profiler.profile(record_shapes=True, with_flops=True) as prof:
        fn()
    events = prof.key_averages()
    mm = [e for e in events if e.key in MATMULS]
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    return sum(e.self_cpu_time_total for e in mm) / 1e6, total, sum(e.flops for e in mm) / 1e9


def isolated_rate(tokens: int, hidden: int, inter: int, repeat: int = 300, tries: int = 5) -> float:
    """GFLOP/s of the pass's largest product (tokens x hidden @ hidden x intermediate) timed alone: the best
    of ``tries`` runs of ``repeat`` products (what the core can do when nothing else runs)."""
    x, w = torch.randn(tokens, hidden), torch.randn(inter, hidden)

    def products() -> None:
        for _ in range(repeat):
            torch.nn.functional.linear(x, w)

    best = min(seconds(products) for _ in range(tries))
    return 2 * tokens * hidden * inter * repeat / best / 1e9


class Stopwatch:
    """Seconds spent inside a wrapped callable (an instance's or a class's attribute), summed."""

    def __init__(self, owner: object, name: str):
        self.total = 0.0
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - start

        setattr(owner, name, timed)


def sampling_split(trainer: LocalTrainer, repeat: int) -> tuple[float, float, float]:
    """Median seconds of one tick's sampling, and the shares inside the model's forward and the KV cache's
    updates (summed over the ``repeat`` calls)."""
    from transformers.cache_utils import DynamicLayer

    model = trainer.sampler.model
    forward, cache = Stopwatch(model, "forward"), Stopwatch(DynamicLayer, "update")
    times = [seconds(lambda: trainer._sample(0)) for _ in range(repeat)]
    return statistics.median(times), forward.total / sum(times), cache.total / sum(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile arm")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-passes-") as tmp:
        cfg = load_train_config(
            ["pair=tiny", "condition=dense", f"out_dir={tmp}/run", "threads=1", "tracking.enabled=false"]
        )
        trainer = LocalTrainer(cfg)
        trainer._setup()
        trainer._sync_sampler(0)
        batch, scores = trainer._sample(0)
    micro = trainer.micro
    adv = grpo.grpo_advantages(scores, batch.response_mask, batch.uids, cfg.rl.norm_adv_by_std)
    arms: dict[str, Callable[[], None]] = {
        "default": passes(trainer, batch, adv),
        "mb32": passes(trainer, batch, adv, micro=micro // 2),
        "mb128": passes(trainer, batch, adv, micro=micro * 2),
    }
    policy_bf16 = copy.deepcopy(trainer.model).to(torch.bfloat16)
    ref_bf16 = copy.deepcopy(trainer.ref).to(torch.bfloat16)
    arms["bf16"] = passes(trainer, batch, adv, model=policy_bf16, ref=ref_bf16)
    if not args.no_compile:
        compiled = copy.deepcopy(trainer.model)
        for layer in compiled.model.layers:
            layer.compile(dynamic=True)
        first = seconds(passes(trainer, batch, adv, model=compiled))
        print(f"compile: first call {first:.1f} s (Inductor's cache: {cache_dir()})")
        arms["compile"] = passes(trainer, batch, adv, model=compiled)
    for fn in arms.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.repeat):
        for name, fn in arms.items():
            times[name].append(seconds(fn))
    print(
        f"a dense tick's passes, {batch.size} sequences, micro-batch {micro}, medians of {args.repeat}; "
        "the ratio to default is the median of the repetitions' ratios and its 95% interval:"
    )
    for name, values in times.items():
        paired = median_interval(v / d for v, d in zip(values, times["default"], strict=True))
        interval = interval_text(paired.low, paired.high)
        print(f"  {name:<8} {statistics.median(values) * 1e3:7.1f} ms  {paired.estimate:.3f}x {interval}")
    mm_s, total_s, gflop = matmul_profile(arms["default"])
    tokens = max(mb.pack().tokens for _, mb in micro_batches(batch, micro))
    shape = trainer.model.config
    alone = isolated_rate(tokens, shape.hidden_size, shape.intermediate_size)
    print(
        f"matrix products: {mm_s / total_s:.0%} of the default's op time ({mm_s * 1e3:.0f} of "
        f"{total_s * 1e3:.0f} ms, profiled) at {gflop / mm_s:.0f} GFLOP/s; the largest one alone "
        f"({tokens} x {shape.hidden_size} @ {shape.hidden_size} x {shape.intermediate_size}): "
        f"{alone:.0f} GFLOP/s"
    )
    sample_s, in_model, in_cache = sampling_split(trainer, args.repeat)
    print(
        f"sampling: {sample_s * 1e3:.0f} ms a tick (median of {args.repeat}), {in_model:.0%} inside the "
        f"model's forward calls, of which the KV cache's updates {in_cache:.0%} of the whole"
    )
    trainer.sampler.model.to(torch.bfloat16)
    trainer._sample(0)  # warm-up
    bf16_s = statistics.median(seconds(lambda: trainer._sample(0)) for _ in range(args.repeat))
    print(f"sampling with bfloat16 weights: {bf16_s * 1e3:.0f} ms a tick, {bf16_s / sample_s:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
