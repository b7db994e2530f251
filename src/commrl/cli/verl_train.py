"""``commrl verl-train``: one cluster training run through verl's ``main_ppo``, the two circuits in its
engine.

    commrl verl-train --pair A --condition method --seed 0 --out results/runs/A/method/seed0
    commrl verl-train --pair B --condition dense --seed 0 --out DIR actor_rollout_ref.model.path=/models/r1
    commrl verl-train --pair A --condition method --seed 0 --out DIR --dry-run   # print verl's config, exit

The run is configs/verl/ (pair, condition) turned into overrides of verl's own ``ppo_trainer`` config, plus
the command line's: ``method.*``, ``model.*``, ``dataset.*``, ``rl.*``, ``ticks``, ``read_at``, ``val_every``
go to commrl's tree, every other ``key=value`` to verl's. After training: ``DIR/final`` (the last checkpoint
as an HF folder), ``DIR/tick<read_at>`` when the read point is an earlier checkpoint, ``DIR/summary.json``.

Exit status: 0 when every asked tick was trained; 2 on a configuration error (``ConfigError``, missing
data files included, and a resume of checkpoints trained under another config: ``commrl.run.fingerprint``,
``DIR/run_config.json``; ``commrl.cli.main``); 1 without a GPU or when verl failed; 3 when verl trained fewer
ticks than asked; 75 when a preemption or time-limit warning (SIGUSR1, reaching verl's TaskRunner
process) stopped it after a step saved by verl: rerun to resume. A bare SIGTERM (preemption without the
warning) ends Ray's processes at once: the run then resumes from its last ``save_freq`` checkpoint (README
"Preemption and time limits").
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from commrl import tracking
from commrl.cli.main import fail
from commrl.errors import ConfigError
from commrl.run import preempt, record
from commrl.run.summary import SUMMARY_FILE

EXIT_ERROR, EXIT_INCOMPLETE = 1, 3
NO_GPU = (
    "verl's main_ppo needs a GPU (vLLM sampling, FSDP training) and {why}. Check the run's config here "
    "with --dry-run; train on CPU with the embedded tiny pipeline instead (commrl train pair=tiny ..., or "
    "snakemake with configs/pipeline/tiny.yaml)"
)
CPU_TORCH = (
    "this Python's torch is a CPU build (torch.version.cuda is None; {python}): on a GPU node, run the job "
    "in envs/train-gpu.yaml (snakemake ... --profile slurm --sdm conda) or in a CUDA environment of your own"
)


def no_gpu_message(cuda_build: str | None) -> str:
    """Why ``torch.cuda.is_available()`` is False, for a torch built for CUDA ``cuda_build`` (None: CPU)."""
    why = (
        CPU_TORCH.format(python=sys.executable)
        if cuda_build is None
        else "this machine has no GPU it can use"
    )
    return NO_GPU.format(why=why + " (torch.cuda.is_available() is False)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pair", required=True, help="A | B (configs/verl/pair/)")
    parser.add_argument(
        "--condition", required=True, help="a condition of configs/condition/ (e.g. dense, method)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="the run's folder")
    parser.add_argument("--data-dir", type=Path, default=None, help="data sets (default: results/data)")
    parser.add_argument(
        "--val-file",
        type=Path,
        default=None,
        help="validation parquet (default: <data-dir>/<val>/test.parquet)",
    )
    parser.add_argument("--config-dir", type=Path, default=None, help="commrl's tree (default: configs/verl)")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved verl config, exit")
    parser.add_argument(
        "--run-spec",
        default=None,
        help="where the MLflow run goes: JSON {kind, parent_run_id, run_name, tags} (set by the verl sweep)",
    )
    parser.add_argument("overrides", nargs="*", help="key=value: method.cadence=10, trainer.save_freq=5, ...")


def run(args: argparse.Namespace) -> int:
    from commrl.verl_ext import config as vc

    data_dir = (args.data_dir or tracking.results_dir() / "data").resolve()
    out_dir = args.out.resolve()
    uri = tracking.default_tracking_uri()
    placement = record.RunSpec.from_json(args.run_spec) if args.run_spec else record.RunSpec()
    run_id = None if args.dry_run else record.recorded_run_id(out_dir, uri)
    spec, cfg = vc.compose_verl_run(
        args.pair,
        args.condition,
        args.seed,
        args.overrides,
        out_dir,
        data_dir,
        args.val_file,
        uri,
        run_id,
        args.config_dir,
    )
    missing = [f for f in (cfg.data.train_files, cfg.data.val_files) if not Path(f).exists()]
    if args.dry_run:
        print(vc.resolved_yaml(cfg), end="")
        for f in missing:
            print(f"commrl verl-train: note: {f} does not exist yet", file=sys.stderr)
        return 0
    import torch

    if not torch.cuda.is_available():
        return fail("verl-train", no_gpu_message(torch.version.cuda), EXIT_ERROR)
    vc.check_model_source(str(cfg.actor_rollout_ref.model.path), spec.pair)
    if missing:
        raise ConfigError(
            f"data file(s) missing: {', '.join(missing)}; prepare them (commrl prepare --dataset "
            f"{spec.train_dataset} / {spec.val_dataset} --out <data-dir>/<name>) or pass --data-dir / "
            "--val-file"
        )
    rollout_stops(cfg, out_dir)
    return train(spec, cfg, out_dir, uri, run_id, placement)


def rollout_stops(cfg, out_dir: Path) -> None:
    """Stop the rollout at the end of the chat template's assistant turn where the model's own files do not
    (``commrl.verl_ext.stops``): vLLM's ``generation_config`` engine argument names a copy that does."""
    from omegaconf import OmegaConf

    from commrl.verl_ext import stops

    model = str(cfg.actor_rollout_ref.model.path)
    try:
        found = stops.rollout_generation_config(model, out_dir)
    except (OSError, ValueError) as err:
        print(
            f"commrl verl-train: warning: could not read {model}'s tokenizer to check where its rollouts "
            f"stop ({err}); vLLM stops at the EOS its files list",
            file=sys.stderr,
        )
        return
    if found is not None:
        folder, token = found
        OmegaConf.update(cfg, stops.ENGINE_KEY, str(folder), force_add=True)
        print(
            f"commrl verl-train: {model} does not list token {token}, which ends its chat template's "
            f"assistant turn, among its stop tokens; the rollout stops there too ({folder})"
        )


def identity(spec, ticks: int) -> record.RunIdentity:
    """The run's identity for its MLflow record (the same tag set as the local driver's runs)."""
    return record.RunIdentity(
        spec.pair, spec.condition, spec.seed, spec.method.codec, "verl", ticks, spec.read_at
    )


def train(spec, cfg, out_dir: Path, tracking_uri: str, run_id: str | None, placement: record.RunSpec) -> int:
    """verl's ``run_ppo`` with commrl's TaskRunner; then count ticks, export HF folders, write the summary.

    First the run's config fingerprint: checked against the one its checkpoints were trained with, if any
    (a ``ConfigError`` on a difference, before MLflow or verl are touched), then written to
    ``DIR/run_config.json``.

    A rerun of a run whose checkpoints already reach the asked ticks trains nothing (verl's ``fit`` would
    step once more after loading the last checkpoint): it only re-exports and rewrites the summary -- after
    a validation-only pass of verl (``trainer.val_only``) when that checkpoint's validation was due but is
    not in the MLflow run (a kill during it: verl saves a step before it validates and logs it).
    """
    from omegaconf import OmegaConf

    from commrl.verl_ext import config as vc
    from commrl.verl_ext.checkpoint import latest_tick, record_run_config, summarize_run, validation_missing

    ticks = int(cfg.trainer.total_training_steps)
    record_run_config(out_dir, spec, cfg)  # a resume under another config stops here, before MLflow and verl
    run_id, _ = record.open_run(identity(spec, ticks), out_dir, tracking_uri, placement, run_id)
    record.log_config(run_id, {"method": spec.method.to_dict()}, tracking_uri)
    OmegaConf.update(cfg, f"{vc.ENV_VARS_KEY}.MLFLOW_RUN_ID", run_id, force_add=True)
    os.environ.update({"MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_RUN_ID": run_id})
    error: BaseException | None = None
    checkpoints = Path(cfg.trainer.default_local_dir)
    keep = int(cfg.trainer.max_actor_ckpt_to_keep or 0)
    prune(checkpoints, keep, spec.read_at)  # what an earlier attempt's process left past verl's count
    done = latest_tick(checkpoints)
    if done < ticks:
        error = run_verl(cfg)
    elif validation_missing(done, int(cfg.trainer.test_freq), ticks, run_id, tracking_uri):
        print(
            f"commrl verl-train: {out_dir} already holds tick {done} of {ticks}, but MLflow run {run_id} has "
            f"no val/acc at {done}; validating it (verl's trainer.val_only), nothing to train"
        )
        OmegaConf.update(cfg, "trainer.val_only", True)
        error = run_verl(cfg)
    else:
        print(f"commrl verl-train: {out_dir} already holds tick {done} of {ticks}; nothing to train")
    prune(checkpoints, keep, spec.read_at)
    stop = preempt.preempted_in(error)
    if stop is not None:  # checkpointed by verl: no export, no summary (the run is not done)
        record.mark_preempted(run_id, stop.tick, stop.signal_name, tracking_uri)
        print(f"commrl verl-train: {stop}; rerun to resume (exit {preempt.EXIT_PREEMPTED})", file=sys.stderr)
        return preempt.EXIT_PREEMPTED
    summary = summarize_run(out_dir, spec, ticks, run_id, tracking_uri, checkpoints=checkpoints)
    status = "FINISHED" if summary.complete and error is None else "FAILED"
    record.finish_run(run_id, status, tracking_uri=tracking_uri)
    if error is not None:
        trained = summary.ticks_trained
        print(f"commrl verl-train: verl failed after {trained} tick(s): {error!r}", file=sys.stderr)
        return EXIT_ERROR
    if not summary.complete:
        print(
            f"commrl verl-train: verl trained {summary.ticks_trained} of {summary.ticks_asked} ticks "
            f"(see {out_dir / SUMMARY_FILE}); a resume that trains nothing exits 0 in verl",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    print(f"commrl verl-train: {summary.ticks_trained} ticks done; final model in {summary.final}")
    return 0


def prune(checkpoints: Path, keep: int, read_at: int) -> None:
    """``checkpoint.prune_checkpoints``, saying on stderr which ticks' checkpoints it deleted."""
    from commrl.verl_ext.checkpoint import prune_checkpoints

    deleted = prune_checkpoints(checkpoints, keep, read_at)
    if deleted:
        print(
            f"commrl verl-train: deleted the checkpoints of ticks {', '.join(map(str, deleted))} under "
            f"{checkpoints} (trainer.max_actor_ckpt_to_keep={keep}: the newest and the read point's "
            f"tick {read_at} are kept; verl counts only its own process's saves)",
            file=sys.stderr,
        )


def run_verl(cfg) -> Exception | None:
    """verl's ``run_ppo`` with ``CommrlTaskRunner``; the error it raised, if any (the caller still counts
    what was trained and writes the summary)."""
    import ray
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    from commrl.verl_ext import config as vc
    from commrl.verl_ext.trainer import CommrlTaskRunner

    auto_set_device(cfg)
    cpus = vc.slurm_ray_cpus(cfg)
    if cpus is not None:
        print(f"commrl verl-train: Ray gets this Slurm job step's {cpus} CPUs (ray_kwargs.ray_init.num_cpus)")
    preempt.shield()  # Ray's daemons, its workers and vLLM start ignoring SIGUSR1; the TaskRunner watches it
    try:
        run_ppo(cfg, task_runner_class=CommrlTaskRunner)
    except Exception as err:
        return err
    finally:
        if ray.is_initialized():
            ray.shutdown()
    return None
