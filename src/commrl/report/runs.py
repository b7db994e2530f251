"""Read the tracked runs of a pair from MLflow (``search_runs`` and ``get_metric_history`` only).

Conventions are those of ``commrl.tracking``: experiment ``commrl/<pair>``; training runs tagged
``kind=train`` with ``condition``, ``codec``, ``seed``, ``read_at``, ``ticks``; evaluation runs tagged
``kind=eval`` and ``benchmark``, nested under the training run they evaluate (``mlflow.parentRunId``, or
``training_run_id``); sweeps are ``kind=sweep`` parents with nested ``kind=trial`` runs.

Rules for what is kept, each reported as a note:
- a training run that is not FINISHED is kept (its data are real), and flagged;
- when a (condition, seed) has several training runs, the newest is kept;
- an evaluation that is not FINISHED is dropped; when a training run has several finished evaluations of
  one benchmark, the newest is kept;
- an evaluation whose training run is not in the pair is dropped;
- with a selection (``commrl.report.selection``, ``commrl report --only``), only the runs it names are
  read: the others in the store are counted in one note.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from commrl import tracking
from commrl.rl.correction import LOGGED_METRICS

if TYPE_CHECKING:
    from commrl.report.selection import RunSelection

REPORT_EXPERIMENT = "commrl/report"
SWEEP_PARAMS: tuple[str, ...] = ("rank", "alpha", "beta", "cadence")
STUDY_TAG = "optuna.study"  # a sweep parent's study name (commrl.sweep)


class ReportInputError(ValueError):
    """Bad input to the report (a pair, a tag, an option): the message names it and the fix."""


# verl's trainer-vs-sampler read-outs, as both drivers log them every tick
ROLLOUT_CORR_METRICS: tuple[str, ...] = LOGGED_METRICS
FIRE = "anchor/fire"
# read on fast ticks only (``on_fast_ticks``): a fire's dense replay is ratio one, so on a fire tick nothing
# is clipped, every eligible token carries gradient and the within-update KL is 0
FAST_TICK_METRICS: tuple[str, ...] = ("actor/effective_token_frac", "actor/pg_clipfrac", "actor/ppo_kl")
TRAIN_METRICS: tuple[str, ...] = (
    "score/mean",
    "actor/kl_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/effective_token_frac",
    "mismatch/logprob_corr",
    "mismatch/prob_gap",
    "mismatch/async_clip_frac_eps0.2",
    "mismatch/async_clip_frac_5x",
    "comm/bytes_activations",
    "comm/bytes_weights",
    "comm/bytes_total",
    "comm/bytes_cumulative",
    "comm/ratio_vs_dense",
    "val/acc",
    "time/step_s",
    "anchor/grad_cosine_raw",
    "anchor/grad_cosine_corrected",
    "codec/energy_captured",
    "sign_memory/agreement",
    *ROLLOUT_CORR_METRICS,
)


@dataclass(frozen=True)
class Series:
    """One metric of one run: values by tick, steps ascending and unique (the last value of a step wins)."""

    steps: np.ndarray
    values: np.ndarray

    @classmethod
    def from_points(cls, points: list[tuple[int, float]]) -> Series:
        by_step = dict(sorted(points, key=lambda p: p[0]))
        steps = np.array(sorted(by_step), dtype=np.int64)
        return cls(steps, np.array([by_step[s] for s in steps], dtype=np.float64))


@dataclass
class TrainRun:
    run_id: str
    name: str
    condition: str
    codec: str
    seed: str
    status: str
    read_at: int | None
    ticks: int | None
    metrics: dict[str, Series] = field(default_factory=dict)


@dataclass
class EvalRun:
    run_id: str
    training_run_id: str
    benchmark: str
    metrics: dict[str, float]


@dataclass
class Trial:
    run_id: str
    name: str
    state: str
    params: dict[str, str]
    objective: float | None
    seed: str | None = None  # the training seed behind the objective (tag ``seed``)
    number: int | None = None  # the Optuna trial number (tag ``optuna.trial``)


@dataclass
class Sweep:
    run_id: str
    name: str
    direction: str
    trials: list[Trial]  # newest first
    study: str | None = None


@dataclass
class PairRuns:
    """Everything the report knows about one pair."""

    pair: str
    train: list[TrainRun]
    evals: list[EvalRun]
    sweeps: list[Sweep]
    notes: list[str] = field(default_factory=list)

    def conditions(self) -> set[str]:
        return {r.condition for r in self.train}

    def runs_of(self, condition: str) -> list[TrainRun]:
        return [r for r in self.train if r.condition == condition]

    def read_at(self) -> int | None:
        """The tick at which the pair is read: the most common ``read_at`` tag of its training runs."""
        values = [r.read_at for r in self.train if r.read_at is not None]
        return Counter(values).most_common(1)[0][0] if values else None


def list_pairs(tracking_uri: str | None = None) -> list[str]:
    """The pairs with an experiment ``commrl/<pair>`` in the store (the report's own excluded)."""
    client = tracking.client(tracking_uri)
    names = [e.name for e in client.search_experiments(filter_string="name LIKE 'commrl/%'")]
    return sorted(n.removeprefix("commrl/") for n in names if n != REPORT_EXPERIMENT)


def load_pair(pair: str, tracking_uri: str | None = None, only: RunSelection | None = None) -> PairRuns:
    """All training, evaluation and sweep runs of ``pair`` (those of ``only`` when given);
    ``ReportInputError`` if it has no experiment."""
    client = tracking.client(tracking_uri)
    name = tracking.experiment_name(pair)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        known = ", ".join(list_pairs(tracking_uri)) or "none"
        uri = tracking_uri or tracking.default_tracking_uri()
        raise ReportInputError(
            f"pair {pair!r}: no experiment {name!r} in the MLflow store {uri} (pairs there: {known}); "
            "check --pair and --tracking-uri"
        )
    exp_id = experiment.experiment_id
    notes: list[str] = []
    train = _load_train(client, exp_id, pair, notes, only)
    evals = _load_evals(client, exp_id, pair, {r.run_id for r in train}, notes, only)
    sweeps = _load_sweeps(client, exp_id, pair, notes, only)
    return PairRuns(pair, train, evals, sweeps, notes)


def _left_out(notes: list[str], pair: str, n: int, kind: str) -> None:
    if n:
        notes.append(f"{pair}: {n} {kind} in the store left out: not among the runs of --only")


def _search(client, exp_id: str, filter_string: str) -> list:
    """Every run matching ``filter_string``, newest first, all result pages."""
    runs, token = [], None
    while True:
        page = client.search_runs(
            [exp_id],
            filter_string=filter_string,
            order_by=["attributes.start_time DESC"],
            max_results=1000,
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _int_tag(tags: dict[str, str], key: str, run_name: str) -> int | None:
    value = tags.get(key)
    if value in (None, "", "None"):
        return None
    try:
        return int(float(value))
    except ValueError as err:
        raise ReportInputError(f"run {run_name!r}: tag {key}={value!r} is not an integer tick") from err


def _load_train(
    client, exp_id: str, pair: str, notes: list[str], only: RunSelection | None
) -> list[TrainRun]:
    seen: set[tuple[str, str]] = set()
    kept: list[tuple[TrainRun, set[str]]] = []
    left_out = 0
    for run in _search(client, exp_id, "tags.kind = 'train'"):
        if only is not None and run.info.run_id not in only.train:
            left_out += 1
            continue
        tags = run.data.tags
        name = run.info.run_name or run.info.run_id
        key = (tags.get("condition", "unknown"), tags.get("seed", "0"))
        if key in seen:
            notes.append(
                f"{pair}: run {name} ({run.info.run_id}) dropped: a newer run of condition {key[0]} "
                f"seed {key[1]} exists"
            )
            continue
        seen.add(key)
        if run.info.status != "FINISHED":
            notes.append(f"{pair}: run {name} is {run.info.status}; its logged ticks are included")
        elif tags.get("stopped_early"):
            notes.append(
                f"{pair}: run {name} ({key[0]} seed {key[1]}) stopped early ({tags['stopped_early']}): its "
                "curves end there, the tables read it at its last tick, and the claims leave it out "
                "(INCONCLUSIVE, named)"
            )
        train_run = TrainRun(
            run_id=run.info.run_id,
            name=name,
            condition=key[0],
            codec=tags.get("codec", ""),
            seed=key[1],
            status=run.info.status,
            read_at=_int_tag(tags, "read_at", name),
            ticks=_int_tag(tags, "ticks", name),
        )
        kept.append((train_run, set(run.data.metrics)))
    _left_out(notes, pair, left_out, "training runs")
    for train_run, logged in tqdm(kept, desc=f"metric histories ({pair})", unit="run", leave=False):
        wanted = [key for key in TRAIN_METRICS if key in logged]
        train_run.metrics = {key: _history(client, train_run.run_id, key) for key in wanted}
        if FIRE in logged and any(key in train_run.metrics for key in FAST_TICK_METRICS):
            train_run.metrics = on_fast_ticks(train_run.metrics, _history(client, train_run.run_id, FIRE))
    return [train_run for train_run, _ in kept]


def fast_ticks(series: Series, fire: Series) -> Series:
    """``series`` on the ticks the anchor did not fire (``anchor/fire`` = 0)."""
    fired = set(fire.steps[fire.values > 0].tolist())
    keep = np.array([step not in fired for step in series.steps], dtype=bool)
    return Series(series.steps[keep], series.values[keep])


def on_fast_ticks(metrics: dict[str, Series], fire: Series) -> dict[str, Series]:
    """``metrics`` with each of ``FAST_TICK_METRICS`` on its fast ticks (``fast_ticks``): a fire's replay is
    the ratio-one dense update, which nothing clips, so its ticks would hide what the compressed circuit's
    clip drops (and draw a sawtooth of zeros into the clip figure)."""
    return {k: fast_ticks(s, fire) if k in FAST_TICK_METRICS else s for k, s in metrics.items()}


def _history(client, run_id: str, key: str) -> Series:
    return Series.from_points([(m.step, m.value) for m in client.get_metric_history(run_id, key)])


def _load_evals(
    client, exp_id: str, pair: str, train_ids: set[str], notes: list[str], only: RunSelection | None
) -> list[EvalRun]:
    seen: set[tuple[str, str]] = set()
    kept = []
    left_out = 0
    for run in _search(client, exp_id, "tags.kind = 'eval'"):
        if only is not None and run.info.run_id not in only.evals:
            left_out += 1
            continue
        tags = run.data.tags
        parent = tags.get("training_run_id") or tags.get("mlflow.parentRunId", "")
        benchmark = tags.get("benchmark", "")
        name = run.info.run_name or run.info.run_id
        if not parent:
            notes.append(f"{pair}: evaluation {name} dropped: it names no training run (tag training_run_id)")
            continue
        if parent not in train_ids:
            notes.append(
                f"{pair}: evaluation {name} dropped: its training run {parent} is not a kept "
                "training run of this pair (missing, or superseded by a newer run)"
            )
            continue
        if run.info.status != "FINISHED":
            notes.append(f"{pair}: evaluation {name} dropped: it is {run.info.status}")
            continue
        if not benchmark:
            notes.append(f"{pair}: evaluation {name} dropped: no benchmark tag")
            continue
        limit = run.data.params.get("limit", "None")
        if limit not in ("None", ""):
            notes.append(f"{pair}: evaluation {name} dropped: it read {limit} problems a task (--limit)")
            continue
        if (parent, benchmark) in seen:
            continue
        seen.add((parent, benchmark))
        prefix = f"eval/{benchmark}/"
        metrics = {k.removeprefix(prefix): v for k, v in run.data.metrics.items() if k.startswith(prefix)}
        kept.append(EvalRun(run.info.run_id, parent, benchmark, metrics))
    _left_out(notes, pair, left_out, "evaluations")
    return kept


def _load_sweeps(client, exp_id: str, pair: str, notes: list[str], only: RunSelection | None) -> list[Sweep]:
    sweeps = []
    left_out = 0
    for run in _search(client, exp_id, "tags.kind = 'sweep'"):
        run_id, tags, params = run.info.run_id, run.data.tags, run.data.params
        if only is not None and not {run_id, tags.get(STUDY_TAG)} & only.studies:
            left_out += 1
            continue
        direction = (tags.get("direction") or params.get("direction") or "maximize").lower()
        read_at = _int_tag(params, "read_at", run.info.run_name or run_id)
        found = _search(client, exp_id, f"tags.kind = 'trial' and tags.mlflow.parentRunId = '{run_id}'")
        trials = [_trial(client, t, read_at) for t in found]
        sweeps.append(Sweep(run_id, run.info.run_name or run_id, direction, trials, tags.get(STUDY_TAG)))
    _left_out(notes, pair, left_out, "sweeps")
    return sweeps


def _trial(client, run, read_at: int | None) -> Trial:
    """A trial run: its searched parameters (tags ``optuna.params.<name>``, else the params ``rank``,
    ``alpha``, ``beta``, ``cadence``) and its objective (metric ``objective``, else ``val/acc`` at the
    sweep's ``read_at`` param)."""
    tags, params = run.data.tags, run.data.params
    prefix = "optuna.params."
    searched = {k.removeprefix(prefix): v for k, v in tags.items() if k.startswith(prefix)}
    searched = searched or {k: params[k] for k in SWEEP_PARAMS if k in params}
    objective = run.data.metrics.get("objective")
    if objective is None and read_at is not None and "val/acc" in run.data.metrics:
        at = [m.value for m in client.get_metric_history(run.info.run_id, "val/acc") if m.step == read_at]
        objective = at[-1] if at else None
    name = f"trial {tags['optuna.trial']}" if "optuna.trial" in tags else run.info.run_name or run.info.run_id
    state = tags.get("optuna.state", run.info.status)
    number = int(tags["optuna.trial"]) if tags.get("optuna.trial", "").isdigit() else None
    return Trial(run.info.run_id, name, state, searched, objective, tags.get("seed"), number)
