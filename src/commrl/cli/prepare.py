"""``commrl prepare``: one dataset (MATH, MATH500, DeepScaleR or the toy task) as verl parquet + manifest.

Writes ``OUT/<split>.parquet``, ``OUT/<split>.jsonl`` for held-out splits and ``OUT/manifest.json``:
``math`` -> train (MATH500 removed), ``math500`` -> test, ``deepscaler`` -> train (MATH500 removed),
``toy`` -> train, validation, test.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from commrl import __version__, tracking
from commrl.cli.main import fail
from commrl.data.schema import QWEN_MATH_TEMPLATE, DataError

DATASETS = ("math", "math500", "deepscaler", "toy")
TOY_KNOBS = (
    ("--seed", "seed", int, "generator seed"),
    ("--n-train", "n_train", int, "train problems"),
    ("--n-val", "n_validation", int, "validation problems"),
    ("--n-test", "n_test", int, "test problems"),
    ("--digits", "digits", int, "digits per operand"),
    ("--operators", "operators", str, "operators drawn from, a subset of '+-*'"),
    ("--n-operands", "n_operands", int, "operands per problem"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from commrl.data.toy import TOY_TEMPLATE, ToyConfig

    d = ToyConfig()
    parser.add_argument("--dataset", required=True, choices=DATASETS)
    parser.add_argument(
        "--source",
        default=None,
        help="hub id or local .jsonl/.json/.parquet file or folder (default: the dataset's hub id)",
    )
    parser.add_argument(
        "--exclude",
        default=None,
        help="MATH500 source (hub id or path) whose problems are "
        "removed; default for math and deepscaler: HuggingFaceH4/MATH-500",
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--prompt-template",
        default=None,
        help="user message with a {problem} placeholder "
        f"(default: {QWEN_MATH_TEMPLATE!r}; toy: {TOY_TEMPLATE!r})",
    )
    toy = parser.add_argument_group("toy task (only with --dataset toy)")
    for flag, field, kind, what in TOY_KNOBS:
        toy.add_argument(
            flag, dest=field, type=kind, default=None, help=f"{what} (default {getattr(d, field)!r})"
        )


def run(args: argparse.Namespace) -> int:
    from commrl.data.files import write_dataset
    from commrl.data.math_datasets import prepare_real
    from commrl.data.toy import ToyConfig, prepare_toy

    created_by = {
        "command": shlex.join(sys.argv),
        "args": vars(args),
        "commrl_version": __version__,
        "git_commit": tracking.git_commit(),
    }
    toy_knobs = {
        field: getattr(args, field) for _, field, _, _ in TOY_KNOBS if getattr(args, field) is not None
    }
    try:
        if args.dataset == "toy":
            if args.source or args.exclude:
                raise DataError("--source and --exclude do not apply to --dataset toy (it is generated)")
            if args.prompt_template:
                toy_knobs["prompt_template"] = args.prompt_template
            prepared = prepare_toy(ToyConfig(**toy_knobs))
        else:
            if toy_knobs:
                flags = [flag for flag, field, _, _ in TOY_KNOBS if field in toy_knobs]
                raise DataError(f"{', '.join(flags)} only apply to --dataset toy, not {args.dataset}")
            prepared = prepare_real(
                args.dataset,
                source=args.source,
                exclude=args.exclude,
                template=args.prompt_template or QWEN_MATH_TEMPLATE,
            )
        manifest = write_dataset(args.out, prepared, created_by)
    except DataError as err:
        return fail("prepare", err)
    m = manifest
    print(
        f"{args.dataset}: {m['rows_in']} rows in, {m['rows_out']} out, "
        f"rejected {m['rows_rejected'] or 'none'}, {m['rows_removed_overlap']} removed as MATH500 overlap "
        f"-> {args.out} ({', '.join(m['outputs'])})"
    )
    return 0
