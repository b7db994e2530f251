"""The summary of a grid study: per cell, val/acc at ``read_at`` over seeds, method - baseline paired by seed
with a 95% interval, the fast-circuit diagnostics, and a heat map.

A cell is a grid point without its seed. Its runs are the study's finished trials (Optuna: which trials,
which points, which MLflow run); every number comes from the trial's MLflow run: ``val/acc`` at step
``read_at``, and the mean over the ticks up to ``read_at`` of each diagnostic the run logged
(``DIAGNOSTICS``; a metric no run logged is left out). With a ``baseline``, a cell's difference pairs each
seed's method value with the baseline's at the same ``prompts_per_tick`` and seed; a seed missing from
either side is left out of the pair (``n`` says how many seeds remain). Intervals are
``commrl.report.stats``'s: Student's t below 20 seeds (paired: the t interval of the per-seed differences),
BCa from 20, none at n = 1.

Files (staged, so ``out`` is replaced whole): ``cells.json`` (settings, completeness, every cell in full),
``cells.csv`` (one flat row per cell), ``runs.csv`` (one row per finished run), ``heatmap.png`` (one panel per
(rank, beta, prompts per tick) of the grid, alpha x cadence cells coloured by method - baseline, or by
the method's val/acc without a baseline, annotated ``mean ± half-width (n)``). All are logged to the study's
MLflow parent run under ``summary/``; a parent whose study has finished every point ends FINISHED.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from commrl import tracking
from commrl.report.stats import CONFIDENCE, Interval, difference_interval, mean_interval
from commrl.run import record
from commrl.staging import staged_dir
from commrl.sweep.budget import FINISHED_STATES, finished
from commrl.sweep.config import SweepConfig
from commrl.sweep.grid import grid_studies
from commrl.sweep.space import RUN_AXES
from commrl.sweep.study import PARENT_ATTR, open_study
from commrl.sweep.trial_config import trial_seed

METRIC = "val/acc"
ALARM = "health/alarm"
DIAGNOSTICS = (
    "anchor/grad_cosine_raw",
    "anchor/grad_cosine_corrected",
    "codec/energy_captured",
    "sign_memory/agreement",
    "mismatch/logprob_corr",
)
HEATMAP = "heatmap.png"


@dataclass(frozen=True)
class RunRecord:
    """One finished trial of a grid study, as its MLflow run recorded it."""

    study: str
    condition: str
    trial: int
    state: str  # COMPLETE | PRUNED
    point: dict[str, Any]  # the grid point (with its seed when seed is an axis)
    seed: int
    run_id: str | None
    value: float | None  # val/acc at read_at
    diagnostics: dict[str, float]  # mean over the ticks up to read_at
    alarm: bool  # health/alarm raised at a tick up to read_at
    note: str | None

    def row(self, axes: Sequence[str]) -> dict[str, Any]:
        """One line of runs.csv."""
        return {
            "study": self.study,
            "condition": self.condition,
            "trial": self.trial,
            "state": self.state,
            **{a: self.point.get(a) for a in axes if a != "seed"},
            "seed": self.seed,
            METRIC: self.value,
            ALARM: int(self.alarm),
            **{d: self.diagnostics.get(d) for d in DIAGNOSTICS},
            "mlflow_run_id": self.run_id,
            "note": self.note,
        }


def read_run(run_id: str, read_at: int) -> tuple[float | None, dict[str, float], bool]:
    """``val/acc`` at ``read_at`` (the newest value logged at that step), the diagnostics' means over the
    steps up to ``read_at``, and whether the collapse alarm was raised there."""
    client = tracking.client()

    def history(key: str) -> list:
        return [
            m for m in client.get_metric_history(run_id, key) if m.step <= read_at and math.isfinite(m.value)
        ]

    at_read = [m for m in history(METRIC) if m.step == read_at]
    value = max(at_read, key=lambda m: m.timestamp).value if at_read else None
    diagnostics = {}
    for key in DIAGNOSTICS:
        values = [m.value for m in history(key)]
        if values:
            diagnostics[key] = sum(values) / len(values)
    return value, diagnostics, any(m.value >= 1.0 for m in history(ALARM))


def collect_runs(cfg: SweepConfig, study: optuna.Study) -> list[RunRecord]:
    """The finished (COMPLETE or PRUNED) trials of one study, read from their MLflow runs."""
    out = []
    for trial in study.get_trials(deepcopy=False, states=FINISHED_STATES):
        out_dir = trial.user_attrs.get("out_dir")
        run_id = trial.user_attrs.get("mlflow_run_id") or (
            record.written_run_id(Path(out_dir)) if out_dir else None
        )
        value, diagnostics, alarm = read_run(run_id, cfg.read_at) if run_id else (None, {}, False)
        note = trial.user_attrs.get("note")
        if trial.state == TrialState.COMPLETE and value is None:
            note = f"no {METRIC} at tick {cfg.read_at} in MLflow run {run_id}" if run_id else "no MLflow run"
        out.append(
            RunRecord(
                study.study_name,
                cfg.condition,
                trial.number,
                trial.state.name,
                dict(trial.params),
                trial_seed(cfg, trial.params),
                run_id,
                value if trial.state == TrialState.COMPLETE else None,
                diagnostics,
                alarm,
                note,
            )
        )
    return out


def _interval(values: dict[str, float]) -> Interval | None:
    return mean_interval(values.values()) if values else None


def _as_dict(interval: Interval | None) -> dict[str, Any] | None:
    """The interval's fields and its half-width (None for an asymmetric interval or none)."""
    if interval is None:
        return None
    return {**interval.as_dict(), "half_width": interval.half_width if interval.symmetric else None}


def cell_table(cfg: SweepConfig, runs: list[RunRecord], baseline: list[RunRecord]) -> list[dict[str, Any]]:
    """One entry per cell of the grid (its point without the seed), in grid order.

    ``method``/``baseline``: the seed mean of val/acc at read_at and its interval; ``difference``: method -
    baseline paired by seed (baseline at the cell's prompts per tick), or None without a baseline or a
    shared seed; ``diagnostics``: per metric, the mean over the cell's runs that logged it and their count.
    """
    axes = [a for a in cfg.space.names if a != "seed"]
    pair_axes = [a for a in axes if a in RUN_AXES]
    cells = []
    for cell in cfg.space.restrict(axes).points():
        mine = [r for r in runs if all(r.point[a] == cell[a] for a in axes)]
        method = {str(r.seed): r.value for r in mine if r.value is not None}
        base = {
            str(r.seed): r.value
            for r in baseline
            if r.value is not None and all(r.point[a] == cell[a] for a in pair_axes)
        }
        shared = sorted(set(method) & set(base))
        difference = (
            difference_interval({s: method[s] for s in shared}, {s: base[s] for s in shared})
            if shared
            else None
        )
        diagnostics = {}
        for key in DIAGNOSTICS:
            values = [r.diagnostics[key] for r in mine if key in r.diagnostics]
            if values:
                diagnostics[key] = {"mean": sum(values) / len(values), "n": len(values)}
        cells.append(
            {
                "cell": cell,
                "seeds": sorted(int(s) for s in method),
                "method": _as_dict(_interval(method)),
                "baseline": _as_dict(_interval(base)),
                "difference": _as_dict(difference),
                "pruned": sum(r.state == TrialState.PRUNED.name for r in mine),
                "alarms": sum(r.alarm for r in mine),
                "diagnostics": diagnostics,
            }
        )
    return cells


def flat_row(entry: dict[str, Any], diagnostics: Sequence[str]) -> dict[str, Any]:
    """One line of cells.csv: the cell's axes, each interval's numbers, counts, ``diagnostics``."""
    row: dict[str, Any] = dict(entry["cell"])
    for part in ("method", "baseline", "difference"):
        interval = entry[part] or {}
        for key in ("estimate", "low", "high", "half_width", "n"):
            row[f"{part}_{key}"] = interval.get(key)
        if part == "difference":
            row["difference_method"] = interval.get("method")
    row["pruned"], row["alarms"] = entry["pruned"], entry["alarms"]
    for key in diagnostics:
        row[key] = entry["diagnostics"].get(key, {}).get("mean")
    return row


def annotation(interval: dict[str, Any] | None, signed: bool) -> str:
    """``mean ± half-width (n)`` of a cell (``[low, high]`` for an asymmetric interval, none at n = 1)."""
    if not interval:
        return "no data"
    mean = f"{interval['estimate']:+.3f}" if signed else f"{interval['estimate']:.3f}"
    n = interval["n"]
    if interval["low"] is None:
        return f"{mean}\n(n={n})"
    if interval["half_width"] is not None:
        return f"{mean} ± {interval['half_width']:.3f}\n(n={n})"
    return f"{mean}\n[{interval['low']:.3f}, {interval['high']:.3f}] (n={n})"


def plot_heatmap(cfg: SweepConfig, cells: list[dict[str, Any]], path: Path) -> None:
    """Panels per (rank, beta) in columns and prompts per tick in rows; alpha x cadence inside each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = cfg.space.names
    part = "difference" if cfg.baseline else "method"
    col_axes = [a for a in ("rank", "beta") if a in names]
    row_axes = [a for a in ("prompts_per_tick",) if a in names]
    cols = list(itertools.product(*(cfg.space.values(a) for a in col_axes)))
    rows = list(itertools.product(*(cfg.space.values(a) for a in row_axes)))
    xs = cfg.space.values("cadence") if "cadence" in names else (None,)
    ys = cfg.space.values("alpha") if "alpha" in names else (None,)
    by_cell = {tuple(sorted(c["cell"].items())): c for c in cells}
    estimates = [c[part]["estimate"] for c in cells if c[part]]
    if part == "difference":
        bound = max([abs(e) for e in estimates] + [0.05])
        cmap, vmin, vmax = plt.get_cmap("RdBu").copy(), -bound, bound
    else:
        cmap, vmin, vmax = plt.get_cmap("viridis").copy(), 0.0, 1.0
    cmap = cmap.with_extremes(bad="#d9d9d9")
    fig, axes = plt.subplots(
        len(rows),
        len(cols),
        figsize=(1.5 + max(3.0, 1.2 * len(xs)) * len(cols), 0.6 + max(2.4, 0.75 * len(ys) + 1.0) * len(rows)),
        squeeze=False,
        constrained_layout=True,
    )
    image = None
    for (i, row), (j, col) in itertools.product(enumerate(rows), enumerate(cols)):
        ax = axes[i][j]
        fixed = dict(zip(row_axes, row, strict=True)) | dict(zip(col_axes, col, strict=True))
        grid = np.full((len(ys), len(xs)), np.nan)
        panel_cells = []
        for (yi, y), (xi, x) in itertools.product(enumerate(ys), enumerate(xs)):
            point = (
                fixed | ({"alpha": y} if y is not None else {}) | ({"cadence": x} if x is not None else {})
            )
            cell = by_cell.get(tuple(sorted(point.items())))
            panel_cells.append(cell)
            interval = cell[part] if cell else None
            if interval:
                grid[yi, xi] = interval["estimate"]
            red, green, blue, _ = cmap((grid[yi, xi] - vmin) / (vmax - vmin)) if interval else (1, 1, 1, 1)
            dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
            ax.text(
                xi,
                yi,
                annotation(interval, signed=part == "difference"),
                ha="center",
                va="center",
                fontsize=7,
                color="white" if dark else "black",
            )
        image = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, origin="lower", aspect="auto")
        ax.set_xticks(range(len(xs)), [str(x) if x is not None else "" for x in xs])
        ax.set_yticks(range(len(ys)), [f"{y:g}" if y is not None else "" for y in ys])
        ax.set_xlabel("anchor cadence K" if xs[0] is not None else "")
        ax.set_ylabel("alpha" if ys[0] is not None else "")
        title = ", ".join(_label(a, v) for a, v in fixed.items()) or cfg.condition
        base = next((c["baseline"] for c in panel_cells if c and c["baseline"]), None)
        if cfg.baseline:
            title += f"\n{cfg.baseline}: " + annotation(base, signed=False).replace("\n", " ")
        ax.set_title(title, fontsize=9)
    what = f"{cfg.condition} − {cfg.baseline}" if cfg.baseline else cfg.condition
    what += f" {METRIC} at tick {cfg.read_at}"
    fig.suptitle(f"{what}\nseed mean ± {CONFIDENCE:.0%} CI half-width (n seeds)", fontsize=10)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label=what)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _label(axis: str, value: Any) -> str:
    return {"prompts_per_tick": f"{value} prompts/tick"}.get(axis, f"{axis} {value:g}")


def _write_csv(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    import pandas as pd

    pd.DataFrame(list(rows)).to_csv(path, index=False)


def summarize_grid(cfg: SweepConfig, name: str, out: str | Path) -> dict[str, Any]:
    """Write the grid summary to ``out`` and log it to the study's parent run; returns cells.json's header."""
    out = Path(out)
    studies = grid_studies(cfg, name)
    opened = {n: open_study(c, n) for c, n in studies}
    runs = {n: collect_runs(c, opened[n]) for c, n in studies}
    baseline = runs[studies[0][1]] if cfg.baseline else []
    cells = cell_table(cfg, runs[name], baseline)
    progress = {n: {"finished": finished(opened[n]), "points": c.n_trials} for c, n in studies}
    header = {
        "study": name,
        "pair": cfg.pair,
        "condition": cfg.condition,
        "baseline": cfg.baseline,
        "baseline_study": studies[0][1] if cfg.baseline else None,
        "metric": f"{METRIC} at tick {cfg.read_at}",
        "confidence": CONFIDENCE,
        "grid": cfg.space.to_dict(),
        "progress": progress,
        "complete": all(p["finished"] >= p["points"] for p in progress.values()),
        "n_cells": len(cells),
        "diagnostics": [d for d in DIAGNOSTICS if any(d in c["diagnostics"] for c in cells)],
    }
    logged = header["diagnostics"]
    with staged_dir(out) as stage:
        (stage / "cells.json").write_text(json.dumps({**header, "cells": cells}, indent=2) + "\n")
        _write_csv(stage / "cells.csv", (flat_row(c, logged) for c in cells))
        _write_csv(stage / "runs.csv", (r.row(cfg.space.names) for rs in runs.values() for r in rs))
        plot_heatmap(cfg, cells, stage / HEATMAP)
    client = tracking.client()
    main_parent = opened[name].user_attrs[PARENT_ATTR]
    client.log_artifacts(main_parent, str(out), "summary")
    for n, study in opened.items():
        parent = study.user_attrs[PARENT_ATTR]
        client.set_tag(parent, "grid.finished", f"{progress[n]['finished']}/{progress[n]['points']}")
        if (
            progress[n]["finished"] >= progress[n]["points"]
            and client.get_run(parent).info.status == "RUNNING"
        ):
            client.set_terminated(parent, "FINISHED")
    return header
