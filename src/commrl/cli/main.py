"""``commrl``: one entry point, one sub-command per pipeline stage.

Each sub-command lives in its own module ``commrl.cli.<name>`` exposing ``add_arguments(parser)`` and
``run(args) -> int``; modules are imported only when their sub-command runs, so ``commrl --help`` is fast.
A ``ConfigError`` out of ``run`` (a setting missing, unknown or out of range) is printed as
``commrl <command>: error: <message>``, without a traceback, and exits ``EXIT_USAGE`` (2, argparse's
status for a bad command line); the commands print their other errors the same way (``fail``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from commrl.errors import ConfigError

EXIT_USAGE = 2  # a bad setting or request

COMMANDS: dict[str, tuple[str, str]] = {
    "init-store": (
        "commrl.cli.init_store",
        "create the MLflow store (and experiments) once, before parallel jobs",
    ),
    "prepare": ("commrl.cli.prepare", "prepare a dataset (MATH, MATH500, DeepScaleR, toy) as verl parquet"),
    "pretrain": ("commrl.cli.pretrain", "pretrain the tiny base policy on the toy task"),
    "train": ("commrl.cli.train", "one training run (local driver), configured with Hydra overrides"),
    "verl-train": ("commrl.cli.verl_train", "one training run on a cluster through verl's main_ppo"),
    "eval": ("commrl.cli.eval", "evaluate one checkpoint on one benchmark with lm-eval"),
    "sweep": ("commrl.cli.sweep", "Optuna sweeps: init, worker, summary"),
    "report": ("commrl.cli.report", "the note's figures and tables from the MLflow store"),
    "compare": (
        "commrl.cli.compare",
        "another run of a study against a report of it, cell by cell and claim by claim",
    ),
    "netmodel": ("commrl.cli.netmodel", "from bytes to seconds: tick time and time to target on a link"),
    "forkserver": (
        "commrl.cli.forkserver",
        "run local jobs as forks of one process that imported torch, verl and MLflow once",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="commrl", description="commrl: run, sweep, evaluate and compare two-circuit RL training."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser = build_parser()
        if argv and argv[0] not in ("-h", "--help"):
            parser.error(f"unknown command {argv[0]!r}; choose one of {', '.join(COMMANDS)}")
        parser.print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    code = _through_fork_server(argv)
    if code is not None:
        return code
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"commrl {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except ConfigError as err:
        return fail(name, err)


def _through_fork_server(argv: list[str]) -> int | None:
    """The job's exit status when a fork server ran it (``commrl.run.forkserver``); None: run it here."""
    from commrl.run import forkserver  # standard library only: `commrl --help` stays fast

    path = os.environ.get(forkserver.ENV_VAR)
    if not path or os.environ.get("SLURM_JOB_ID"):
        return None
    if argv[0] not in forkserver.FORKABLE or forkserver.in_fork():
        return None
    return forkserver.submit(path, argv)


def fail(command: str, error: object, code: int = EXIT_USAGE) -> int:
    """Print ``commrl <command>: error: <error>`` to stderr; return ``code``, the exit status."""
    print(f"commrl {command}: error: {error}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
