"""Where one training job's wall time goes: start-up (interpreter and imports, model build, sampler build),
sampling, training, weight push, validation, checkpoints and tracking, as shares of the job's wall time.

Each arm is one `commrl train` process, as a Snakemake training job runs it (one thread, its own MLflow
store under the output folder, never results/mlflow.db); the trainer writes its phase seconds into
``summary.json`` (``time_s``, commrl.rl.timing) and the rest of the wall time is the interpreter's start and
the imports. Arms alternate, so a busy machine slows both alike; the ratio is of medians, and beside it the
median of each repetition's ratio with its 95% interval (from 6 repetitions: ``median_interval``).

    .venv/bin/python benchmarks/bench_job.py                           # the tiny pair's default, 2 repeats
    .venv/bin/python benchmarks/bench_job.py --arm vllm=sampler.backend=vllm --arm hf=sampler.backend=hf
    .venv/bin/python benchmarks/bench_job.py --condition dense --repeat 3 --out results/benchmarks/job.json
    .venv/bin/python benchmarks/bench_job.py --forkserver     # each arm also as a fork (`make pipeline`)

With ``--forkserver`` every arm also runs as a job of a fork server (``commrl.run.forkserver``, what `make
pipeline` runs under), arm ``NAME+fork``: its start-up is the client's and the fork's, not the imports.

Needs the tiny base model and the toy data:
`snakemake --cores 2 results/models/tiny-base/base_accuracy.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from commrl.report.stats import median_interval
from commrl.report.style import format_interval
from commrl.run import forkserver

REPO = Path(__file__).resolve().parents[1]
START_UP = "start_up"  # interpreter start and imports: the job's wall time the trainer did not measure


def start_job(
    overrides: list[str],
    condition: str,
    out: Path,
    *,
    threads: int = 1,
    seed: int = 0,
    server: str | None = None,
) -> tuple[subprocess.Popen, float]:
    """Start one `commrl train` process (as a Snakemake job runs it); the process and its start time."""
    cmd = [
        sys.executable,
        "-m",
        "commrl.cli.main",
        "train",
        "pair=tiny",
        f"condition={condition}",
        f"seed={seed}",
        f"out_dir={out}",
        f"threads={threads}",
        f"tracking.uri=sqlite:///{out.parent / 'mlflow.db'}",
        *overrides,
    ]
    env = {**os.environ, "COMMRL_NO_PROGRESS": "1", "OMP_NUM_THREADS": str(threads)}
    env.pop(forkserver.ENV_VAR, None)
    if server:
        env[forkserver.ENV_VAR] = server
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / "log").open("w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    return proc, time.perf_counter()


def finish_job(proc: subprocess.Popen, started: float, out: Path) -> dict[str, float]:
    """Wait for a job of ``start_job``; its phase seconds plus ``start_up`` and ``wall``."""
    proc.wait()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        tail = (out.parent / "log").read_text()[-3000:]
        raise SystemExit(f"{' '.join(proc.args)} failed:\n{tail}")
    phases = json.loads((out / "summary.json").read_text())["time_s"]
    return {START_UP: wall - sum(phases.values()), **phases, "wall": wall}


def run_job(overrides: list[str], condition: str, out: Path, server: str | None = None) -> dict[str, float]:
    """One `commrl train` process, one thread; its phase seconds plus ``start_up`` and ``wall``."""
    return finish_job(*start_job(overrides, condition, out, server=server), out)


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def print_table(arms: dict[str, dict[str, float]]) -> None:
    names = list(arms)
    width = {n: max(12, len(n) + 3) for n in names}  # an arm's column fits its name
    keys = [k for k in next(iter(arms.values())) if k != "wall"]
    print(f"{'phase':<14}" + "".join(f"{n + ' s':>{width[n]}}{'share':>8}" for n in names))
    for key in [*keys, "wall"]:
        cells = "".join(f"{arms[n][key]:>{width[n]}.2f}{arms[n][key] / arms[n]['wall']:>8.0%}" for n in names)
        print(f"{key:<14}{cells}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--arm",
        action="append",
        default=None,
        help="NAME=override[,override...] (default: one arm, the pair's defaults)",
    )
    parser.add_argument("--condition", default="method")
    parser.add_argument("--repeat", type=int, default=2, help="runs per arm (median)")
    parser.add_argument("--out", type=Path, default=None, help="JSON of every run and the medians")
    parser.add_argument(
        "--forkserver", action="store_true", help="also run every arm through a fork server (NAME+fork)"
    )
    args = parser.parse_args(argv)
    arms = {"default": []}
    if args.arm:
        arms = {}
        for spec in args.arm:
            name, _, overrides = spec.partition("=")
            arms[name] = [o for o in overrides.split(",") if o]
    with tempfile.TemporaryDirectory(prefix="bench-job-") as tmp, contextlib.ExitStack() as stack:
        server = None
        if args.forkserver:
            process = stack.enter_context(forkserver.ServerProcess(cwd=REPO))
            if not process.wait(ready=True):  # no measured job forks from a half-loaded server
                raise SystemExit("the fork server did not start")
            server = process.path
        variants = [(name, overrides, None) for name, overrides in arms.items()]
        if server:
            variants = [v for name, o, _ in variants for v in ((name, o, None), (f"{name}+fork", o, server))]
        runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in variants}
        for k in range(args.repeat):
            for name, overrides, socket_path in variants:
                out = Path(tmp) / f"{name}-{k}" / "run"
                runs[name].append(run_job(overrides, args.condition, out, socket_path))
                print(f"[{name} #{k}] wall {runs[name][-1]['wall']:.1f} s", file=sys.stderr)
    table = {name: medians(r) for name, r in runs.items()}
    print(f"{args.condition}, tiny pair, one thread, medians of {args.repeat} run(s) per arm:")
    print_table(table)
    if len(table) > 1:
        first, *rest = table
        for name in rest:
            paired = median_interval(
                a["wall"] / b["wall"] for a, b in zip(runs[name], runs[first], strict=True)
            )
            median = (
                format_interval(paired)
                if paired.low is not None
                else f"{paired.estimate:.4g} ({paired.note})"
            )
            print(
                f"wall {name} / {first}: {table[name]['wall'] / table[first]['wall']:.3f}x (medians); "
                f"the repetitions' ratios: median {median}"
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"arms": arms, "runs": runs, "medians": table}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
