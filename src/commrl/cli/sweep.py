"""``commrl sweep``: Optuna sweeps of the method's knobs, in three steps.

    commrl sweep init    --config configs/sweep/tiny.yaml [--study tiny-method] [--out init.json]
    commrl sweep worker  --config configs/sweep/tiny.yaml [--study tiny-method] --worker 0 [--out w0.json]
    commrl sweep summary --config configs/sweep/tiny.yaml [--study tiny-method] --out SUMMARY_DIR

``init`` creates the study and its MLflow parent run once (a second call is a no-op); start any number of
``worker``s afterwards, rerun them after a crash or preemption (they do only what is left); ``summary``
writes best_params.json, trials.csv, importances.json and the plots. The study name defaults to
``<pair>-<condition>``. Exit status: 0 done, 2 a bad config (``ConfigError``, a study created with other
settings included: ``commrl.cli.main``), 1 a study that cannot be used as asked (``SweepError``), 75 a
worker stopped by SIGUSR1 or SIGTERM (a preemption or time-limit warning): its running trial checkpointed
and was queued again with the same params (unless its ``heartbeat.max_retry`` retries were used: the message
says which); rerun the worker to go on.

A grid config (``sampler: {name: grid}``, e.g. configs/sweep/tiny-regime.yaml) runs the same three steps
on its studies (``commrl.sweep.grid``): with a ``baseline``, ``init`` and ``worker`` do the baseline's
study ``<study>-<baseline>`` first, then the grid's; ``summary`` writes the cells of the grid
(cells.csv, cells.json, runs.csv, heatmap.png: ``commrl.sweep.grid_summary``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

EXIT_STUDY = 1  # a study that cannot be used as asked (``SweepError``)
COMMANDS = {
    "init": "create the study, enqueue the defaults and the MLflow parent run (once)",
    "worker": "run trials until the study's budget is used",
    "summary": "best params, trials table, importances and plots of a study",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="{init,worker,summary}")
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "--config", required=True, type=Path, help="the sweep config, e.g. configs/sweep/tiny.yaml"
        )
        p.add_argument("--study", default=None, help="study name (default: <pair>-<condition>)")
        if name == "worker":
            p.add_argument(
                "--worker",
                type=int,
                default=0,
                help="worker index: its sampler seed is seed + index (a rerun of the index: a new seed)",
            )
        p.add_argument(
            "--out",
            type=Path,
            required=name == "summary",
            help="summary: the output folder; init/worker: a JSON record of what was done",
        )


def run(args: argparse.Namespace) -> int:
    from commrl.cli.main import fail
    from commrl.errors import ConfigError
    from commrl.sweep.config import load_sweep_config
    from commrl.sweep.study import SweepError

    cfg = load_sweep_config(args.config)
    study = args.study or f"{cfg.pair}-{cfg.condition}"
    try:
        if args.action == "init":
            return _init(cfg, study, args.out)
        if args.action == "worker":
            if not 0 <= args.worker < cfg.n_workers:
                raise ConfigError(
                    f"--worker={args.worker} is out of range: workers are 0 .. {cfg.n_workers - 1} "
                    f"(n_workers={cfg.n_workers} in {args.config}; raise n_workers to run more of them)"
                )
            return _worker(cfg, study, args.worker, args.out)
        return _summary(cfg, study, args.out)
    except SweepError as err:
        return fail("sweep", err, EXIT_STUDY)


def _init(cfg, study: str, out: Path | None) -> int:
    from commrl.sweep.grid import grid_studies
    from commrl.sweep.study import init_study
    from commrl.sweep.summary import dashboard_hint
    from commrl.sweep.trial_config import check_trials

    studies = grid_studies(cfg, study)
    for part, _ in studies:
        check_trials(part)
    records = []
    for part, name in studies:
        record = init_study(part, name)
        what = "created" if record["created"] else "already there (nothing changed)"
        print(
            f"study {name!r} ({part.condition}, {part.n_trials} trials) in {cfg.storage.location}: {what}; "
            f"MLflow parent run {record['mlflow_parent_run_id']}"
        )
        records.append(record)
    print(dashboard_hint(cfg))
    if out:
        _write_json(out, _combined(records))
    return 0


def _worker(cfg, study: str, worker: int, out: Path | None) -> int:
    from commrl.run import preempt
    from commrl.sweep.grid import grid_studies
    from commrl.sweep.worker import run_worker

    records = []
    try:
        with preempt.watch():
            for part, name in grid_studies(cfg, study):
                record = run_worker(part, name, worker)
                print(
                    f"worker {worker}: ran trials {[t['number'] for t in record['trials']]}; "
                    f"study {name!r} has {record['finished']}/{record['n_trials']} finished trials"
                )
                records.append(record)
    except preempt.Preempted as stop:
        outcome = "; ".join(getattr(stop, "__notes__", ())) or "no trial was running"
        print(f"worker {worker}: {stop}; {outcome}; rerun the worker", file=sys.stderr)
        return preempt.EXIT_PREEMPTED
    if out:
        _write_json(out, _combined(records))
    return 0


def _combined(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The record of the study itself, with its baseline study's (a grid's, done first) under ``baseline``."""
    *baseline, main = records
    return {**main, "baseline": baseline[0]} if baseline else main


def _summary(cfg, study: str, out: Path) -> int:
    if cfg.is_grid:
        return _grid_summary(cfg, study, out)
    from commrl.sweep.summary import summarize

    best = summarize(cfg, study, out)
    if best["best_params"] is None:
        print(f"study {study!r}: no complete trial yet ({best['states']})")
    else:
        print(
            f"study {study!r}: best val/acc {best['best_value']:.4f} at trial {best['best_trial']} "
            f"with {best['best_params']}"
        )
        if len(best["best_ties"]) > 1:
            print(
                f"trials {best['best_ties']} tie at that value (one seed each): the pick among them is "
                "arbitrary"
            )
    print(f"summary written to {out}")
    print(best["dashboard"])
    return 0


def _grid_summary(cfg, study: str, out: Path) -> int:
    from commrl.sweep.grid_summary import summarize_grid

    header = summarize_grid(cfg, study, out)
    done = ", ".join(f"{n} {p['finished']}/{p['points']}" for n, p in header["progress"].items())
    print(f"grid study {study!r}: points finished {done}; {header['n_cells']} cells")
    print(f"summary written to {out} (cells.csv, cells.json, runs.csv, heatmap.png)")
    return 0


def _write_json(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` atomically (a temporary file renamed over ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
