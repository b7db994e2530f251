"""The report's tables, one function per table, values taken from the per-condition curves and eval runs.

A table is columns plus rows of raw cells (``float``, ``int``, ``str`` or ``None`` for "not logged");
formatting is the renderer's job, so ``tables.json`` keeps the exact values.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from commrl.report import curves as cv
from commrl.report.runs import SWEEP_PARAMS, PairRuns, Sweep
from commrl.report.style import benchmark_label, order_benchmarks, order_conditions

Cell = float | int | str | None
KL_TICKS: tuple[int, ...] = (50, 100, 150)
MISMATCH_METRICS: dict[str, str] = {
    "mismatch/logprob_corr": "log-prob corr",
    "mismatch/prob_gap": "prob gap",
    "mismatch/async_clip_frac_eps0.2": "async clip eps 0.2",
    "mismatch/async_clip_frac_5x": "async clip 5x",
}
FINISHED_TRIAL_STATES = ("COMPLETE", "FINISHED")


@dataclass
class Table:
    key: str
    title: str
    columns: list[str]
    rows: list[list[Cell]]
    note: str | None = None

    def as_dict(self) -> dict:
        return {"title": self.title, "columns": self.columns, "rows": self.rows, "note": self.note}


def _conditions(runs: PairRuns) -> list[str]:
    return order_conditions(runs.conditions())


def _empty(key: str, title: str, columns: list[str], what: str, runs: PairRuns) -> Table:
    note = f"{title}: no runs with {what} in pair {runs.pair}"
    return Table(key, title, columns, [], note)


def final_scores(runs: PairRuns) -> Table:
    """Score at the read tick (the last logged tick not after ``read_at``; the last tick without one).

    ``gain = score(read) - start``, start the mean of the first three logged ticks; ``ticks asked`` is the
    largest ``ticks`` tag of the condition's runs, ``last tick`` the last tick any of them logged.
    """
    columns = [
        "condition",
        "seeds",
        "ticks asked",
        "last tick",
        "start (first 3 ticks)",
        "tick",
        "score",
        "gain",
    ]
    found = cv.curves(runs, "score/mean", _conditions(runs))
    rows: list[list[Cell]] = []
    for condition, curve in found.items():
        asked = [r.ticks for r in runs.runs_of(condition) if r.ticks is not None]
        start = cv.start_mean(curve)
        tick, score = cv.value_at(curve, runs.read_at()) or (None, None)
        gain = None if score is None else score - start
        last = int(curve.steps[-1])
        rows.append([condition, curve.seeds, max(asked, default=None), last, start, tick, score, gain])
    return (
        Table("final_scores", "Final scores", columns, rows)
        if rows
        else _empty("final_scores", "Final scores", columns, "score/mean", runs)
    )


def best_validation(runs: PairRuns) -> Table:
    """Base (first read), best, tick of the best, and the value at the read tick of ``val/acc``."""
    columns = ["condition", "seeds", "base", "best", "best tick", "read tick", "at read tick"]
    rows: list[list[Cell]] = []
    for condition, curve in cv.curves(runs, "val/acc", _conditions(runs)).items():
        best_tick, best_value = cv.best(curve) or (None, None)
        tick, value = cv.value_at(curve, runs.read_at()) or (None, None)
        rows.append([condition, curve.seeds, float(curve.mean[0]), best_value, best_tick, tick, value])
    return (
        Table("best_validation", "Best validation accuracy", columns, rows)
        if rows
        else _empty("best_validation", "Best validation accuracy", columns, "val/acc", runs)
    )


def kl_table(runs: PairRuns, ticks: Sequence[int] = KL_TICKS) -> Table:
    """``actor/kl_loss`` (nats) at exactly the given ticks (None where not logged) and at the last tick."""
    columns = ["condition", "seeds", *(f"KL @ {t}" for t in ticks), "last tick", "KL @ last"]
    rows: list[list[Cell]] = []
    for condition, curve in cv.curves(runs, "actor/kl_loss", _conditions(runs)).items():
        last_tick, last = cv.value_at(curve, None) or (None, None)
        rows.append([condition, curve.seeds, *(cv.exact_at(curve, t) for t in ticks), last_tick, last])
    return (
        Table("kl", "KL to the reference policy (nats)", columns, rows)
        if rows
        else _empty("kl", "KL to the reference policy (nats)", columns, "actor/kl_loss", runs)
    )


def mismatch_table(runs: PairRuns) -> Table:
    """Mean over ticks of each sampler/trainer mismatch statistic (method.md §4)."""
    columns = ["condition", "seeds", *MISMATCH_METRICS.values()]
    rows: list[list[Cell]] = []
    for condition in _conditions(runs):
        found = {m: cv.condition_curve(runs, condition, m) for m in MISMATCH_METRICS}
        if all(c is None for c in found.values()):
            continue
        seeds = max(c.seeds for c in found.values() if c is not None)
        means = [None if c is None else cv.mean_over_ticks(c) for c in found.values()]
        rows.append([condition, seeds, *means])
    title = "Mismatch statistics (mean over ticks)"
    return (
        Table("mismatch", title, columns, rows)
        if rows
        else _empty("mismatch", title, columns, "mismatch/* metrics", runs)
    )


def bytes_table(runs: PairRuns) -> Table:
    """Mean ``comm/ratio_vs_dense``; cumulative bytes at the last tick and relative to dense's cumulative.

    ``cumulative / dense = B_c(t) / B_dense(t)`` at ``t`` the last tick both logged.
    """
    columns = [
        "condition",
        "seeds",
        "mean ratio vs dense",
        "last tick",
        "cumulative bytes",
        "cumulative / dense",
    ]
    conditions = _conditions(runs)
    ratio = cv.curves(runs, "comm/ratio_vs_dense", conditions)
    cumulative = cv.curves(runs, "comm/bytes_cumulative", conditions)
    dense = cumulative.get("dense")
    rows: list[list[Cell]] = []
    for condition in conditions:
        r, c = ratio.get(condition), cumulative.get(condition)
        if r is None and c is None:
            continue
        last_tick, last = (cv.value_at(c, None) or (None, None)) if c is not None else (None, None)
        relative = None
        if c is not None and dense is not None:
            tick = cv.last_common_tick(c, dense)
            denominator = None if tick is None else cv.exact_at(dense, tick)
            if denominator:
                relative = cv.exact_at(c, tick) / denominator
        seeds = (r or c).seeds
        mean_ratio = None if r is None else cv.mean_over_ticks(r)
        rows.append([condition, seeds, mean_ratio, last_tick, last, relative])
    title = "Bytes on the wire relative to dense"
    return (
        Table("bytes", title, columns, rows)
        if rows
        else _empty("bytes", title, columns, "comm/* metrics", runs)
    )


def eval_scores(runs: PairRuns, metric: str = "acc") -> dict[str, dict[str, list[float]]]:
    """``benchmark -> condition -> [value per seed]`` of ``eval/<benchmark>/<metric>``."""
    condition_of = {r.run_id: r.condition for r in runs.train}
    scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for ev in runs.evals:
        if metric in ev.metrics:
            scores[ev.benchmark][condition_of[ev.training_run_id]].append(ev.metrics[metric])
    return {b: dict(scores[b]) for b in order_benchmarks(scores)}


def benchmark_table(runs: PairRuns) -> Table:
    """Per-benchmark ``acc`` (and ``pass_at_8`` where logged), mean over seeds, one column per condition."""
    by_metric = {m: eval_scores(runs, m) for m in ("acc", "pass_at_8")}
    conditions = order_conditions({c for s in by_metric.values() for per in s.values() for c in per})
    rows: list[list[Cell]] = []
    for metric, scores in by_metric.items():
        for benchmark, per in scores.items():
            cells = [float(np.mean(per[c])) if c in per else None for c in conditions]
            rows.append([benchmark_label(benchmark), benchmark, metric, *cells])
    columns = ["benchmark", "task", "metric", *conditions]
    title = "Accuracy per benchmark"
    return (
        Table("benchmarks", title, columns, rows)
        if rows
        else _empty("benchmarks", title, columns, "eval/BENCHMARK/acc (kind=eval)", runs)
    )


def best_trial(sweep: Sweep):
    """The finished trial with the best ``objective`` in the sweep's direction; None when there is none."""
    done = [t for t in sweep.trials if t.objective is not None and t.state in FINISHED_TRIAL_STATES]
    if not done:
        return None
    pick = min if sweep.direction == "minimize" else max
    return pick(done, key=lambda t: t.objective)


def _ordered(params: dict[str, str]) -> list[tuple[str, str]]:
    """The note's knobs (rank, alpha, beta, cadence) first, then the others alphabetically."""
    first = [k for k in SWEEP_PARAMS if k in params]
    return [(k, params[k]) for k in first + sorted(set(params) - set(first))]


def sweep_table(runs: PairRuns) -> Table | None:
    """One row per sweep: trials by ``optuna.state``, the best trial, its objective and parameters."""
    if not runs.sweeps:
        return None
    columns = ["sweep", "direction", "trials", "states", "best trial", "objective", "best parameters"]
    rows: list[list[Cell]] = []
    for sweep in runs.sweeps:
        states = Counter(t.state for t in sweep.trials)
        best = best_trial(sweep)
        counts = ", ".join(f"{s} {n}" for s, n in sorted(states.items()))
        rows.append(
            [
                sweep.name,
                sweep.direction,
                len(sweep.trials),
                counts,
                None if best is None else best.name,
                None if best is None else best.objective,
                None if best is None else ", ".join(f"{k}={v}" for k, v in _ordered(best.params)),
            ]
        )
    return Table("sweeps", "Sweeps", columns, rows)


def pair_tables(runs: PairRuns) -> list[Table]:
    """Every table of one pair, in report order (the sweep table only when the pair has sweeps)."""
    tables = [
        final_scores(runs),
        best_validation(runs),
        kl_table(runs),
        mismatch_table(runs),
        bytes_table(runs),
        benchmark_table(runs),
    ]
    sweeps = sweep_table(runs)
    return tables + ([sweeps] if sweeps is not None else [])
