"""``commrl pretrain``: the tiny base policy, pretrained on the toy task, saved as an HF model directory.

Writes ``OUT/`` (model, tokenizer) and ``OUT/base_accuracy.json`` (greedy validation accuracy, T=1 pass
rate, steps, seconds, seed). Exits 1 when the greedy accuracy did not land in ``[--target-acc,
--max-acc]`` within ``--max-steps`` (the directory is still written, so the run can be inspected), unless
``--no-window-check`` (a quick smoke base policy, e.g. for a pipeline subset).

``--shipped DIR`` stages a checked-in output of this command (``assets/tiny-base``) instead of training,
after checking that it was made with the recipe and on the data asked for (``commrl.models.shipped``):
every machine then starts from the same base policy.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from commrl.models.pretrain import PretrainConfig

    d = PretrainConfig()
    parser.add_argument(
        "--data", required=True, help="toy dataset directory (`commrl prepare --dataset toy`)"
    )
    parser.add_argument("--out", required=True, help="model directory to write")
    parser.add_argument(
        "--seed", type=int, default=d.seed, help="model init and data order (default %(default)s)"
    )
    parser.add_argument("--max-steps", type=int, default=d.max_steps, help="step limit (default %(default)s)")
    parser.add_argument(
        "--target-acc",
        type=float,
        default=d.target_acc,
        help="stop once greedy validation accuracy reaches this (default %(default)s)",
    )
    parser.add_argument(
        "--max-acc",
        type=float,
        default=d.max_acc,
        help="upper edge of the accuracy window; a jump past it is landed back (default %(default)s)",
    )
    parser.add_argument(
        "--label-noise",
        type=float,
        default=d.label_noise,
        help="fraction of training targets made deliberately wrong (default %(default)s)",
    )
    parser.add_argument("--lr", type=float, default=d.lr, help="AdamW learning rate (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="(default %(default)s)")
    parser.add_argument(
        "--shipped",
        metavar="DIR",
        default=None,
        help="copy this checked-in output of the same command (its SHIPPED.json must match the recipe and "
        "the data) instead of training, e.g. assets/tiny-base",
    )
    parser.add_argument(
        "--no-window-check",
        action="store_true",
        help="exit 0 even when the accuracy ends outside the window (report it as a warning)",
    )


def run(args: argparse.Namespace) -> int:
    from commrl.cli.main import fail
    from commrl.data.schema import DataError
    from commrl.models.pretrain import PretrainConfig, pretrain
    from commrl.models.shipped import stage_shipped

    try:
        cfg = PretrainConfig(
            seed=args.seed,
            max_steps=args.max_steps,
            target_acc=args.target_acc,
            max_acc=args.max_acc,
            label_noise=args.label_noise,
            lr=args.lr,
            batch_size=args.batch_size,
        ).validate()
        if args.shipped:
            result = stage_shipped(args.shipped, args.out, args.data, cfg)
        else:
            result = pretrain(args.data, args.out, cfg)
    except DataError as err:
        return fail("pretrain", err)
    source = f"shipped {args.shipped}" if args.shipped else "trained"
    made = "pretrained in " if args.shipped else ""
    print(
        f"base policy ({source}) -> {args.out}: greedy validation acc {result['greedy_acc']:.3f}, "
        f"T=1 pass rate {result['pass_rate_t1']:.3f}, {made}{result['steps']} steps, "
        f"{result['seconds']:.0f} s"
    )
    if not result["in_window"]:
        level = "warning" if args.no_window_check else "error"
        print(
            f"commrl pretrain: {level}: greedy exact match {result['greedy_exact_match']:.3f} is outside "
            f"[--target-acc {cfg.target_acc}, --max-acc {cfg.max_acc}] after {result['steps']} steps; "
            "raise --max-steps (below the window) or widen the window (above it)",
            file=sys.stderr,
        )
        return 0 if args.no_window_check else 1
    return 0
