"""``commrl forkserver``: local jobs as forks of one process that has imported the heavy libraries once.

    commrl forkserver run -- snakemake --cores 2     # a command with a server up (what `make pipeline` runs)
    commrl forkserver serve SOCKET                    # the server itself (started by `run`)
    commrl forkserver serve SOCKET --preload torch    # ... importing less

Under ``run``, every ``commrl`` job of the command is still its own process (a fork), with its own streams,
signals and exit status: ``commrl.run.forkserver``.
"""

from __future__ import annotations

import argparse

from commrl.run import forkserver


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    run_p = sub.add_parser("run", help="run a command with a fork server up; its exit status")
    run_p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    serve_p = sub.add_parser("serve", help="serve jobs on a Unix socket until SIGTERM")
    serve_p.add_argument("socket", help="the socket's path (must not exist)")
    serve_p.add_argument(
        "--preload",
        nargs="+",
        default=list(forkserver.PRELOAD),
        metavar="MODULE[:FUNCTION]",
        help="what to import once (default: the libraries of every local job)",
    )
    serve_p.add_argument(
        "--parent-fd",
        type=int,
        default=None,
        help="a pipe's read end from the launcher: the server stops when it closes (the launcher died)",
    )


def run(args: argparse.Namespace) -> int:
    if args.action == "serve":
        return forkserver.serve(args.socket, args.preload, args.parent_fd)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("commrl forkserver run: error: give the command after --")
    return forkserver.run_with_server(command)
