"""Lock-step timing of several trainers, one process each, taking turns one tick at a time.

The parent starts the arms one after another (each start-up is timed alone), then, every repetition, tells
each arm in turn (the order rotates) to run one tick and waits for it to finish. No two arms ever compute at
once, and a drift of the machine's load reaches every arm alike, so per-repetition ratios are fair on a noisy
machine. A worker times a tick from the go signal to its trainer's end-of-tick callback.

Protocol over a ``multiprocessing`` pipe: worker -> parent ``("ready", info)``, ``("tick", timings)``,
``("done", {})``, ``("error", traceback)``; parent -> worker ``"go"`` (run one tick) or ``"stop"``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from commrl.report import stats


@dataclass
class Arm:
    """One contestant: a worker kind and its settings (for commrl, Hydra overrides of `commrl train`)."""

    label: str
    kind: str
    overrides: list[str] = field(default_factory=list)


class WorkerFailed(RuntimeError):
    """An arm's process failed, died or went silent; the message names its log file."""


class TickClock:
    """Worker side: a tick starts at the go signal (``wait``) and ends at the trainer's callback (``lap``)."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.wall0 = self.cpu0 = 0.0

    def ready(self, info: dict) -> None:
        self.conn.send(("ready", info))

    def wait(self) -> bool:
        """Block until the parent says go (True) or stop (False), then start the clock."""
        message = self.conn.recv()
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return message == "go"

    def lap(self) -> dict[str, float]:
        """Wall and CPU (this process, all threads) seconds since the go signal."""
        return {"wall_s": time.perf_counter() - self.wall0, "cpu_s": time.process_time() - self.cpu0}

    def tick(self, timings: dict) -> bool:
        """Report a finished tick and wait for the next go (True) or stop (False)."""
        self.conn.send(("tick", timings))
        return self.wait()


def redirect_output(log_path: Path) -> None:
    """Send this process's stdout and stderr (library chatter) to a log file; the parent prints the table."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _receive(conn, proc, arm: Arm, log: Path, timeout_s: float) -> tuple[str, dict]:
    if not conn.poll(timeout_s):
        raise WorkerFailed(f"arm {arm.label} sent nothing for {timeout_s:.0f} s; see {log}")
    try:
        kind, payload = conn.recv()
    except EOFError:
        proc.join(5)
        raise WorkerFailed(f"arm {arm.label} died (exit code {proc.exitcode}); see {log}") from None
    if kind == "error":
        raise WorkerFailed(f"arm {arm.label} failed; see {log}:\n{payload}")
    return kind, payload


def run_lockstep(
    target: Callable,
    arms: list[Arm],
    warmup: int,
    ticks: int,
    workdir: Path,
    extra: tuple = (),
    timeout_s: float = 900.0,
) -> dict[str, dict]:
    """Run ``warmup + ticks`` ticks of every arm in turn; ``target(arm, n_ticks, workdir, conn, *extra)`` is
    the worker process. Returns per arm its ready info and its ticks (``warmup`` flags the untimed ones)."""
    ctx = mp.get_context("spawn")
    total = warmup + ticks
    procs, conns, results = {}, {}, {}

    def receive(arm: Arm) -> tuple[str, dict]:
        return _receive(conns[arm.label], procs[arm.label], arm, workdir / f"{arm.label}.log", timeout_s)

    try:
        for arm in tqdm(arms, desc="start-up", unit="arm"):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=target, args=(arm, total, workdir, child, *extra), daemon=True)
            proc.start()
            child.close()
            procs[arm.label], conns[arm.label] = proc, parent
            results[arm.label] = {**receive(arm)[1], "ticks": []}
        for rep in tqdm(range(total), desc="ticks", unit="rep"):
            shift = rep % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                conns[arm.label].send("go")
                tick = receive(arm)[1]
                results[arm.label]["ticks"].append(
                    {"tick": rep, "warmup": rep < warmup, "turn": shift, **tick}
                )
        for arm in arms:
            conns[arm.label].send("stop")
        for arm in arms:
            receive(arm)
            procs[arm.label].join(60)
    finally:
        for proc in procs.values():
            if proc.is_alive():
                proc.terminate()
                proc.join(10)
    return results


def timed_ticks(result: dict, fire: bool | None = None) -> list[dict]:
    """The counted ticks of one arm; with ``fire`` set, only its fire (True) or fast (False) ticks."""
    return [t for t in result["ticks"] if not t["warmup"] and (fire is None or t.get("fire", False) == fire)]


INTERVAL_KEYS = ("of_means_low", "of_means_high", "median_low", "median_high")


def interval_text(low: float | None, high: float | None) -> str:
    """``[low, high]`` to 3 decimals, or ``-`` without an interval."""
    return "-" if low is None or high is None else f"[{low:.3f}, {high:.3f}]"


def ratio(num: dict, den: dict, key: str = "wall_s", fire: bool | None = None) -> dict[str, float]:
    """``num`` over ``den`` on ``key``: the ratio of the means (amortised over the counted ticks) and the
    median of the per-repetition ratios, each with its 95% interval (``of_means_low``/``_high``: Fieller's,
    or BCa from 20 repetitions, paired by repetition; ``median_low``/``_high``: the median's order
    statistics; None with too few ticks); with ``fire`` set, only ``num``'s fire (or fast) ticks, each
    against ``den``'s tick of the same repetition."""
    pairs = [
        (a[key], b[key])
        for a, b in zip(num["ticks"], den["ticks"], strict=True)
        if not a["warmup"] and (fire is None or a.get("fire", False) == fire)
    ]
    if not pairs:
        nan = float("nan")
        return {"of_means": nan, "median_paired": nan, "n": 0} | dict.fromkeys(INTERVAL_KEYS)
    means = stats.ratio_interval(
        {str(i): a for i, (a, _) in enumerate(pairs)},
        {str(i): b for i, (_, b) in enumerate(pairs)},
        nonnegative=True,
    )
    median = stats.median_interval(a / b for a, b in pairs)
    return {
        "of_means": means.estimate,
        "of_means_low": means.low,
        "of_means_high": means.high,
        "median_paired": median.estimate,
        "median_low": median.low,
        "median_high": median.high,
        "n": len(pairs),
    }
