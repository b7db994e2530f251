"""The report's tables, one function per table, values read per seed from the runs and eval runs.

A table is columns plus rows of raw cells: ``Interval`` for a value from stochastic runs (the seed mean and
its 95% interval, ``commrl.report.stats``), ``float``, ``int``, ``str`` or ``None`` for "not logged".
Formatting is the renderer's job (``0.654 ± 0.021 (n=3)``), so ``tables.json`` keeps the exact values: an
interval cell is ``{"mean", "low", "high", "n", "method"}`` (low and high null with one seed).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from commrl.report import curves as cv
from commrl.report.runs import SWEEP_PARAMS, PairRuns, Series, Sweep
from commrl.report.stats import Interval, mean_interval, ratio_interval
from commrl.report.style import ASYNC_CONDITIONS, benchmark_label, order_benchmarks, order_conditions
from commrl.sweep import best as sweep_best

Cell = Interval | float | int | str | None
KL_TICKS: tuple[int, ...] = (50, 100, 150)
MISMATCH_METRICS: dict[str, str] = {
    "mismatch/logprob_corr": "log-prob corr",
    "mismatch/prob_gap": "prob gap",
    "mismatch/async_clip_frac_eps0.2": "async clip eps 0.2",
    "mismatch/async_clip_frac_5x": "async clip 5x",
}
FINISHED_TRIAL_STATES = ("COMPLETE", "FINISHED")
ASYNC_METRICS: dict[str, str] = {  # per seed, the mean over ticks
    "actor/effective_token_frac": "effective token frac",  # on fast ticks (runs.FAST_TICK_METRICS)
    "rollout_corr/kl": "rollout_corr kl",
    "rollout_corr/k3_kl": "k3 kl",
    "rollout_corr/chi2_token": "chi2 token",
}
ASYNC_OPTIONAL_METRICS: dict[str, str] = {  # only the corrections that compute them log them
    "rollout_corr/rollout_is_eff_sample_size": "IS eff sample size",
    "rollout_corr/rollout_rs_masked_fraction": "RS masked frac",
    "rollout_corr/rollout_rs_seq_masked_fraction": "RS seq masked frac",
}


def cell_json(cell: Cell) -> Cell | dict:
    """A cell as ``tables.json`` keeps it: an interval as ``{"mean", "low", "high", "n", "method"}``."""
    if isinstance(cell, Interval):
        return {"mean": cell.estimate, "low": cell.low, "high": cell.high, "n": cell.n, "method": cell.method}
    return cell


@dataclass
class Table:
    key: str
    title: str
    columns: list[str]
    rows: list[list[Cell]]
    note: str | None = None

    def as_dict(self) -> dict:
        rows = [[cell_json(c) for c in row] for row in self.rows]
        return {"title": self.title, "columns": self.columns, "rows": rows, "note": self.note}


def _conditions(runs: PairRuns) -> list[str]:
    return order_conditions(runs.conditions())


def _empty(key: str, title: str, columns: list[str], what: str, runs: PairRuns) -> Table:
    note = f"{title}: no runs with {what} in pair {runs.pair}"
    return Table(key, title, columns, [], note)


def _interval(values: Iterable[float]) -> Interval | None:
    """The seed mean and its interval; None without values."""
    values = list(values)
    return mean_interval(values) if values else None


def _tick(ticks: Iterable[int]) -> int | str | None:
    """The tick the seeds were read at: ``40``, or ``38-40`` when they differ; None without seeds."""
    ticks = sorted(set(ticks))
    if not ticks:
        return None
    return ticks[0] if len(ticks) == 1 else f"{ticks[0]}-{ticks[-1]}"


def _split(found: Mapping[str, tuple[int, float]]) -> tuple[dict[str, int], dict[str, float]]:
    """``seed -> (tick, value)`` into ``seed -> tick`` and ``seed -> value``."""
    return {k: t for k, (t, _) in found.items()}, {k: v for k, (_, v) in found.items()}


def _at_last_common_tick(series: Mapping[str, Series]) -> tuple[int | None, Interval | None]:
    """The last tick every seed logged and the interval of the values there."""
    tick = cv.last_common_tick(list(series.values()))
    if tick is None:
        return None, None
    return tick, _interval(cv.per_seed(series, lambda s: cv.exact_at(s, tick)).values())


def final_scores(runs: PairRuns) -> Table:
    """Score at the read tick (per seed, its last logged tick not after ``read_at``; the last tick without).

    ``gain = score(read) - start`` per seed, start the mean of the seed's first three logged ticks;
    ``ticks asked`` is the largest ``ticks`` tag of the condition's runs, ``last tick`` the last tick any of
    them logged.
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
    rows: list[list[Cell]] = []
    for condition in _conditions(runs):
        series = cv.seed_series(runs, condition, "score/mean")
        if not series:
            continue
        asked = [r.ticks for r in runs.runs_of(condition) if r.ticks is not None]
        start = cv.per_seed(series, cv.start_mean)
        ticks, score = _split(cv.per_seed(series, lambda s: cv.value_at(s, runs.read_at())))
        gain = [score[k] - start[k] for k in score if k in start]
        last = max(int(s.steps[-1]) for s in series.values())
        rows.append(
            [
                condition,
                len(series),
                max(asked, default=None),
                last,
                _interval(start.values()),
                _tick(ticks.values()),
                _interval(score.values()),
                _interval(gain),
            ]
        )
    return (
        Table("final_scores", "Final scores", columns, rows)
        if rows
        else _empty("final_scores", "Final scores", columns, "score/mean", runs)
    )


def best_validation(runs: PairRuns) -> Table:
    """Per seed: base (first read), best up to the read tick, tick of the best and the value at the read tick
    of ``val/acc``."""
    columns = ["condition", "seeds", "base", "best", "best tick", "read tick", "at read tick"]
    rows: list[list[Cell]] = []
    for condition in _conditions(runs):
        series = cv.seed_series(runs, condition, "val/acc")
        if not series:
            continue
        _, base = _split(cv.per_seed(series, cv.first))
        best_tick, best = _split(cv.per_seed(series, cv.windowed(cv.best, runs.read_at())))
        ticks, value = _split(cv.per_seed(series, lambda s: cv.value_at(s, runs.read_at())))
        rows.append(
            [
                condition,
                len(series),
                _interval(base.values()),
                _interval(best.values()),
                _interval(best_tick.values()),
                _tick(ticks.values()),
                _interval(value.values()),
            ]
        )
    return (
        Table("best_validation", "Best validation accuracy", columns, rows)
        if rows
        else _empty("best_validation", "Best validation accuracy", columns, "val/acc", runs)
    )


def kl_table(runs: PairRuns, ticks: Iterable[int] = KL_TICKS) -> Table:
    """``actor/kl_loss`` (nats) at exactly the given ticks (over the seeds that logged each; None where none
    did) and at the last tick every seed logged."""
    ticks = tuple(ticks)
    columns = ["condition", "seeds", *(f"KL @ {t}" for t in ticks), "last tick", "KL @ last"]
    rows: list[list[Cell]] = []
    for condition in _conditions(runs):
        series = cv.seed_series(runs, condition, "actor/kl_loss")
        if not series:
            continue
        at = [_interval(cv.per_seed(series, lambda s, t=t: cv.exact_at(s, t)).values()) for t in ticks]
        rows.append([condition, len(series), *at, *_at_last_common_tick(series)])
    return (
        Table("kl", "KL to the reference policy (nats)", columns, rows)
        if rows
        else _empty("kl", "KL to the reference policy (nats)", columns, "actor/kl_loss", runs)
    )


def mismatch_table(runs: PairRuns) -> Table:
    """Per seed the mean over ticks up to the read tick of each sampler/trainer mismatch statistic
    (method.md §4)."""
    columns = ["condition", "seeds", *MISMATCH_METRICS.values()]
    rows: list[list[Cell]] = []
    for condition in _conditions(runs):
        found = {m: cv.seed_series(runs, condition, m) for m in MISMATCH_METRICS}
        if not any(found.values()):
            continue
        seeds = max(len(s) for s in found.values())
        mean = cv.windowed(cv.mean_over_ticks, runs.read_at())
        means = [_interval(cv.per_seed(s, mean).values()) for s in found.values()]
        rows.append([condition, seeds, *means])
    title = "Mismatch statistics (mean over ticks up to the read tick)"
    return (
        Table("mismatch", title, columns, rows)
        if rows
        else _empty("mismatch", title, columns, "mismatch/* metrics", runs)
    )


def async_table(runs: PairRuns) -> Table | None:
    """The asynchronous conditions (``style.ASYNC_CONDITIONS``): per seed val/acc at the read tick and its
    gain over the first read (``curves.gain_at``), and the mean over ticks of the effective token fraction
    and of verl's rollout_corr read-outs (an optional column only when some run logged it). None when the
    pair has no asynchronous run (Figure 14's note says so)."""
    conditions = order_conditions(runs.conditions() & set(ASYNC_CONDITIONS))
    optional = {
        m: label
        for m, label in ASYNC_OPTIONAL_METRICS.items()
        if any(cv.seed_series(runs, c, m) for c in conditions)
    }
    metrics = ASYNC_METRICS | optional
    columns = ["condition", "seeds", "read tick", "val at read", "val gain", *metrics.values()]
    rows: list[list[Cell]] = []
    for condition in conditions:
        val = cv.seed_series(runs, condition, "val/acc")
        found = {m: cv.seed_series(runs, condition, m) for m in metrics}
        if not val and not any(found.values()):
            continue
        ticks, at = _split(cv.per_seed(val, lambda s: cv.value_at(s, runs.read_at())))
        _, gain = _split(cv.per_seed(val, lambda s: cv.gain_at(s, runs.read_at())))
        mean = cv.windowed(cv.mean_over_ticks, runs.read_at())
        means = [_interval(cv.per_seed(s, mean).values()) for s in found.values()]
        seeds = max(len(val), *(len(s) for s in found.values()))
        rows.append(
            [
                condition,
                seeds,
                _tick(ticks.values()),
                _interval(at.values()),
                _interval(gain.values()),
                *means,
            ]
        )
    if not rows:
        return None
    title = (
        "Asynchronous training and rollout correction (val at the read tick, the rest mean over ticks to it; "
        "the effective token frac over fast ticks only)"
    )
    return Table("async", title, columns, rows)


def bytes_table(runs: PairRuns) -> Table:
    """Per seed ``comm/ratio_vs_dense`` at the read tick (the ledger's running ratio, the run's bytes so far
    over its own dense equivalent so far: its mean over ticks weighed the first ticks' fires most);
    cumulative bytes at the last tick every seed logged; and cumulative relative to dense, the ratio of seed
    means ``mean_s B_c(t) / mean_s B_dense(t)`` at ``t`` the last tick every seed of both logged
    (``stats.ratio_interval``, paired by seed when the seeds match)."""
    columns = [
        "condition",
        "seeds",
        "ratio vs own dense at read",
        "last tick",
        "cumulative bytes",
        "cumulative / dense",
    ]
    dense = cv.seed_series(runs, "dense", "comm/bytes_cumulative")
    rows: list[list[Cell]] = []
    for condition in _conditions(runs):
        ratio = cv.seed_series(runs, condition, "comm/ratio_vs_dense")
        cumulative = cv.seed_series(runs, condition, "comm/bytes_cumulative")
        if not ratio and not cumulative:
            continue
        last_tick, last = _at_last_common_tick(cumulative) if cumulative else (None, None)
        rows.append(
            [
                condition,
                max(len(ratio), len(cumulative)),
                _interval(
                    v for _, v in cv.per_seed(ratio, lambda s: cv.value_at(s, runs.read_at())).values()
                ),
                last_tick,
                last,
                _relative(cumulative, dense),
            ]
        )
    title = "Bytes on the wire relative to dense"
    return (
        Table("bytes", title, columns, rows)
        if rows
        else _empty("bytes", title, columns, "comm/* metrics", runs)
    )


def _relative(cumulative: Mapping[str, Series], dense: Mapping[str, Series]) -> Interval | None:
    """``mean_s B_c(t) / mean_s B_dense(t)`` at the last tick every seed of both logged; None when there is
    no such tick or dense sent nothing."""
    if not cumulative or not dense:
        return None
    tick = cv.last_common_tick([*cumulative.values(), *dense.values()])
    if tick is None:
        return None
    here = cv.per_seed(cumulative, lambda s: cv.exact_at(s, tick))
    there = cv.per_seed(dense, lambda s: cv.exact_at(s, tick))
    return ratio_interval(here, there, nonnegative=True) if any(there.values()) else None


def eval_scores(runs: PairRuns, metric: str = "acc") -> dict[str, dict[str, list[float]]]:
    """``benchmark -> condition -> [value per seed]`` of ``eval/<benchmark>/<metric>``."""
    condition_of = {r.run_id: r.condition for r in runs.train}
    scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for ev in runs.evals:
        if metric in ev.metrics:
            scores[ev.benchmark][condition_of[ev.training_run_id]].append(ev.metrics[metric])
    return {b: dict(scores[b]) for b in order_benchmarks(scores)}


def benchmark_table(runs: PairRuns) -> Table:
    """Per-benchmark ``acc`` (and ``pass_at_8`` where logged): the seed mean and its interval, one column per
    condition."""
    by_metric = {m: eval_scores(runs, m) for m in ("acc", "pass_at_8")}
    conditions = order_conditions({c for s in by_metric.values() for per in s.values() for c in per})
    rows: list[list[Cell]] = []
    for metric, scores in by_metric.items():
        for benchmark, per in scores.items():
            cells = [_interval(per[c]) if c in per else None for c in conditions]
            rows.append([benchmark_label(benchmark), benchmark, metric, *cells])
    columns = ["benchmark", "task", "metric", *conditions]
    title = "Accuracy per benchmark"
    return (
        Table("benchmarks", title, columns, rows)
        if rows
        else _empty("benchmarks", title, columns, "eval/BENCHMARK/acc (kind=eval)", runs)
    )


def best_trial(sweep: Sweep):
    """The finished trial with the best ``objective`` in the sweep's direction, on a tie the lowest trial
    number (``commrl.sweep.best``, the rule of the sweep's ``best_params.json``); None when there is none."""
    return sweep_best.best_trial(_finished(sweep), _objective, _number(sweep), sweep.direction)


def _finished(sweep: Sweep) -> list:
    return [t for t in sweep.trials if t.state in FINISHED_TRIAL_STATES]


def _objective(trial) -> float | None:
    return trial.objective


def _number(sweep: Sweep):
    """A trial's Optuna number (tag ``optuna.trial``); without it, its place in start order."""
    started = {id(t): i for i, t in enumerate(reversed(sweep.trials))}  # ``sweep.trials`` is newest first
    return lambda t: t.number if t.number is not None else started[id(t)]


def _ordered(params: dict[str, str]) -> list[tuple[str, str]]:
    """The note's knobs (rank, alpha, beta, cadence) first, then the others alphabetically."""
    first = [k for k in SWEEP_PARAMS if k in params]
    return [(k, params[k]) for k in first + sorted(set(params) - set(first))]


def tied_with(sweep: Sweep, best) -> list[str]:
    """The other finished trials whose objective equals the best's exactly (the pick among them is the
    lowest number, not a better value)."""
    return [t.name for t in sweep_best.tied_with(_finished(sweep), best, _objective)]


def sweep_table(runs: PairRuns) -> Table | None:
    """One row per sweep: trials by ``optuna.state``, the training seeds of its trials (each objective is one
    seed's), the best trial, its objective and parameters, and the trials tied with it."""
    if not runs.sweeps:
        return None
    columns = [
        "sweep",
        "direction",
        "trials",
        "states",
        "training seeds",
        "best trial",
        "objective (one seed)",
        "best parameters",
        "tied with best",
    ]
    rows: list[list[Cell]] = []
    for sweep in runs.sweeps:
        states = Counter(t.state for t in sweep.trials)
        best = best_trial(sweep)
        counts = ", ".join(f"{s} {n}" for s, n in sorted(states.items()))
        seeds = sorted({t.seed for t in sweep.trials if t.seed is not None})
        rows.append(
            [
                sweep.name,
                sweep.direction,
                len(sweep.trials),
                counts,
                ", ".join(seeds) or None,
                None if best is None else best.name,
                None if best is None else best.objective,
                None if best is None else ", ".join(f"{k}={v}" for k, v in _ordered(best.params)),
                None if best is None else ", ".join(tied_with(sweep, best)) or "none",
            ]
        )
    return Table(
        "sweeps", "Sweeps (each trial trains one seed: its objective has no interval)", columns, rows
    )


def pair_tables(runs: PairRuns) -> list[Table]:
    """Every table of one pair, in report order (the async table only when the pair has asynchronous runs,
    the sweep table only when it has sweeps)."""
    tables = [
        final_scores(runs),
        best_validation(runs),
        kl_table(runs),
        mismatch_table(runs),
        bytes_table(runs),
        benchmark_table(runs),
    ]
    optional = (async_table(runs), sweep_table(runs))
    return tables + [t for t in optional if t is not None]
