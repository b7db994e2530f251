"""The note's qualitative claims, checked on this run's seeds: the note's value, the threshold, a verdict.

Every claim is computed per seed (the read-out of each seed's own curve: the score or val/acc at the read
tick, the mean over ticks), then over the seeds of each condition with a 95% interval
(``commrl.report.stats``: the seed mean, a difference paired by seed, or a ratio of means). The verdict is
three-way: PASS when the interval lies entirely on the claim's side of its threshold, MISS when entirely on
the other side, INCONCLUSIVE when it straddles the threshold or when there is no interval (one seed). A
claim of two checks (claims 5, 9, 10 and 13) passes when both pass and misses when either misses; its n,
estimate and interval are those of the check that decides it (the first MISS, else the first INCONCLUSIVE,
else the first), its reason names every check. A claim over alternatives (claim 14: does any of the rollout
corrections close the gap) passes when any check passes and misses when every check misses; its deciding
check is the first PASS, else the first INCONCLUSIVE, else the first, its reason names the passing
checks first ("passing: none" when there is none), and each of its ``m`` intervals is at ``1 - 0.05 / m``
(Bonferroni). A claim whose runs or metrics are missing is ``n/a`` and
says what is missing; a claim over a condition with a run that did not finish is INCONCLUSIVE and names it.

Every threshold lives in ``ClaimThresholds``. "The read tick" is the pair's ``read_at`` tag (per seed, its
last logged tick not after it), or the last tick when runs carry none. A mean over ticks
is taken over the ticks up to the read tick: runs that go on past it (pair A's long KL runs) are read on
the same window as the others. The KL claims (4, 5) read the last tick both conditions logged, as the note's
Figure 6 does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Literal, NamedTuple

from commrl.report import curves as cv
from commrl.report import stats
from commrl.report.runs import PairRuns, ReportInputError, Series
from commrl.report.stats import INCONCLUSIVE, MISS, PASS, Interval, Side
from commrl.report.style import format_interval

NA = "n/a"
STATUSES: tuple[str, ...] = (PASS, MISS, INCONCLUSIVE, NA)
Combine = Literal["all", "any"]  # a claim's checks: every one must pass, or one passing is enough
ASYNC_CORRECTIONS: tuple[str, ...] = ("method_async_tis", "method_async_icepop", "method_async_seq_rs")


@dataclass(frozen=True)
class ClaimThresholds:
    """The thresholds of the claims (defaults from the report brief); one place, overridable by name."""

    dense_min_gain: float = 0.05
    method_max_score_gap: float = 0.05
    anchor_off_max_gain_fraction: float = 0.5
    kl_min_ratio_method_dense: float = 10.0
    controls_max_kl_fraction: float = 0.25
    dense_min_corr: float = 0.99
    method_max_corr: float = 0.9
    gap_min_ratio: float = 10.0
    dense_max_async_clip: float = 0.01
    method_min_async_clip: float = 0.2
    same_sampler_min_corr: float = 0.99
    same_sampler_min_gain: float = 0.05
    val_max_gap: float = 0.05
    method_min_gain_over_anchor_only: float = 0.0
    async_method_max_effective_frac: float = 0.35
    async_method_max_gain_vs_dense: float = 0.0
    async_correction_max_val_gap: float = 0.05
    async_tis_max_val_gap: float = 0.05

    @classmethod
    def with_overrides(cls, overrides: dict[str, float]) -> ClaimThresholds:
        """The defaults with ``name -> value`` replaced; an unknown name raises ``ReportInputError``."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ReportInputError(
                f"unknown claim threshold(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**{k: float(v) for k, v in overrides.items()})


@dataclass(frozen=True)
class Check:
    """One comparison of a claim: ``quantity`` (its interval) against ``threshold`` on ``side``."""

    quantity: str
    interval: Interval
    side: Side
    threshold: float
    status: str
    reason: str

    def as_dict(self) -> dict:
        return {
            "quantity": self.quantity,
            "side": self.side,
            "threshold": self.threshold,
            "status": self.status,
            "reason": self.reason,
            **self.interval.as_dict(),
        }


def check(quantity: str, interval: Interval, side: Side, threshold: float) -> Check:
    """The ``Check`` of ``interval`` against ``threshold`` (``stats.verdict``)."""
    status, reason = stats.verdict(interval, side, threshold)
    return Check(quantity, interval, side, threshold, status, reason)


def deciding(checks: tuple[Check, ...], combine: Combine = "all") -> Check:
    """The check that decides the claim: of a conjunction (``all``), the first MISS, else the first
    INCONCLUSIVE, else the first; of alternatives (``any``), the first PASS, else the first INCONCLUSIVE,
    else the first."""
    for status in (MISS, INCONCLUSIVE) if combine == "all" else (PASS, INCONCLUSIVE):
        for c in checks:
            if c.status == status:
                return c
    return checks[0]


@dataclass(frozen=True)
class Claim:
    """One claim on one pair: its checks, the status of the deciding check, why (each check's interval
    against its threshold), the text shown.

    ``values``: the seed means per condition and the ticks read, for reference; ``combine``: ``all`` (every
    check must pass) or ``any`` (alternatives: one passing check passes the claim).
    """

    number: int
    claim: str
    note: str
    threshold: str
    value: str
    status: str
    reason: str
    checks: tuple[Check, ...] = ()
    values: dict[str, float | int | str | None] = field(default_factory=dict)
    combine: Combine = "all"

    @property
    def decided_by(self) -> Check | None:
        return deciding(self.checks, self.combine) if self.checks else None

    @property
    def n(self) -> int | None:
        """Seeds behind the deciding check (the smaller side of a comparison)."""
        return None if self.decided_by is None else self.decided_by.interval.n

    @property
    def interval(self) -> Interval | None:
        return None if self.decided_by is None else self.decided_by.interval

    def as_dict(self) -> dict:
        interval = self.interval
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "checks"}
        return out | {
            "n": self.n,
            "estimate": None if interval is None else interval.estimate,
            "low": None if interval is None else interval.low,
            "high": None if interval is None else interval.high,
            "checks": [c.as_dict() for c in self.checks],
        }


class _Missing(Exception):
    """A claim's inputs are not in the store; the message says which."""


class _Unfinished(Exception):
    """A claim's condition has a run that did not finish; the message names it."""


Result = tuple[tuple[Check, ...], str, dict]


def _series(runs: PairRuns, condition: str, metric: str) -> dict[str, Series]:
    """``seed -> series``; a run of ``condition`` that is not FINISHED (failed, killed, still running)
    makes the claim INCONCLUSIVE rather than read its ticks before the stop as its result."""
    unfinished = [r for r in runs.runs_of(condition) if r.status != "FINISHED"]
    if unfinished:
        named = ", ".join(f"{condition} seed {r.seed} is {r.status}" for r in unfinished)
        raise _Unfinished(f"{named}: a claim reads finished runs only (its logged ticks are in the tables)")
    found = cv.seed_series(runs, condition, metric)
    if not found:
        raise _Missing(f"no {condition} runs with {metric}")
    return found


def _ticks(ticks: Mapping[str, int]) -> str:
    """``40`` when every seed was read at one tick, else ``38-40``."""
    low, high = min(ticks.values()), max(ticks.values())
    return str(low) if low == high else f"{low}-{high}"


def _mean(values: Mapping[str, float]) -> float:
    return sum(values.values()) / len(values)


def _seed_mean(values: Mapping[str, float], spec: str = ".3f") -> str:
    """The seed mean with its 95% interval and seed count, as the claims table prints a condition's value."""
    return format_interval(stats.mean_interval(values.values()), spec)


def _read(runs: PairRuns, condition: str, metric: str) -> tuple[dict[str, float], dict[str, int]]:
    """Per seed, the value of ``metric`` at the read tick, and that tick. A seed whose run ended before the
    read tick (stopped early by a callback: a collapse alarm, a pruner) makes the claim INCONCLUSIVE and is
    named: its last value would be paired with the other seeds' and conditions' values at the read tick."""
    series, read_at = _series(runs, condition, metric), runs.read_at()
    short = {
        seed: int(s.steps.max())
        for seed, s in series.items()
        if read_at is not None and s.steps.max() < read_at
    }
    if short:
        named = ", ".join(
            f"{condition} seed {seed} ends at tick {tick}" for seed, tick in sorted(short.items())
        )
        raise _Unfinished(
            f"{named}, before the read tick {read_at}: a claim reads every seed at the read tick"
        )
    found = cv.per_seed(series, lambda s: cv.value_at(s, read_at))
    if not found:
        raise _Missing(f"no {condition} tick of {metric} logged at or before the read tick {runs.read_at()}")
    return {k: v for k, (_, v) in found.items()}, {k: t for k, (t, _) in found.items()}


def _gains(runs: PairRuns, condition: str) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    """Per seed ``(start, gain, read tick)``: gain = score(read) - mean of the seed's first three ticks."""
    score, ticks = _read(runs, condition, "score/mean")
    start = cv.per_seed(_series(runs, condition, "score/mean"), cv.start_mean)
    seeds = sorted(set(score) & set(start))
    return {s: start[s] for s in seeds}, {s: score[s] - start[s] for s in seeds}, ticks


def _mean_over_ticks(runs: PairRuns, condition: str, metric: str) -> dict[str, float]:
    """Per seed, the mean of ``metric`` over its ticks up to the read tick."""
    found = cv.per_seed(_series(runs, condition, metric), cv.windowed(cv.mean_over_ticks, runs.read_at()))
    if not found:
        raise _Missing(f"{condition} {metric} is NaN at every tick")
    return found


def _at_common_tick(runs: PairRuns, condition: str, other: str, metric: str) -> tuple[int, dict, dict]:
    """The last tick every seed of both conditions logged, and each condition's values there."""
    a, b = _series(runs, condition, metric), _series(runs, other, metric)
    tick = cv.last_common_tick([*a.values(), *b.values()])
    if tick is None:
        raise _Missing(f"the seeds of {condition} and {other} share no logged tick of {metric}")
    return (
        tick,
        cv.per_seed(a, lambda s: cv.exact_at(s, tick)),
        cv.per_seed(b, lambda s: cv.exact_at(s, tick)),
    )


def _dense_learns(runs: PairRuns, t: ClaimThresholds) -> Result:
    start, gain, ticks = _gains(runs, "dense")
    interval = stats.mean_interval(gain.values())
    score = _mean(start) + interval.estimate
    text = (
        f"dense {_seed_mean(start)} -> {score:.3f} at tick {_ticks(ticks)}; gain {format_interval(interval)}"
    )
    values = {"start": _mean(start), "score": score, "tick": _ticks(ticks), "gain": interval.estimate}
    return (check("dense gain", interval, "at_least", t.dense_min_gain),), text, values


def _method_matches_dense(runs: PairRuns, t: ClaimThresholds) -> Result:
    method, dense = _read(runs, "method", "score/mean"), _read(runs, "dense", "score/mean")
    return _method_vs_dense(method, dense, "method - dense score", t.method_max_score_gap)


def _method_vs_dense(
    method: tuple[dict[str, float], dict[str, int]],
    dense: tuple[dict[str, float], dict[str, int]],
    name: str,
    margin: float,
) -> Result:
    """method - dense by seed ((value, tick) per seed of each), within +-``margin``."""
    (vm, tm), (vd, td) = method, dense
    diff = stats.difference_interval(vm, vd)
    text = (
        f"method {_seed_mean(vm)} (tick {_ticks(tm)}) vs dense {_seed_mean(vd)} (tick {_ticks(td)}); "
        f"diff {format_interval(diff)}"
    )
    values = {
        "method": _mean(vm),
        "dense": _mean(vd),
        "method_tick": _ticks(tm),
        "dense_tick": _ticks(td),
        "diff": diff.estimate,
    }
    return (check(name, diff, "within", margin),), text, values


def _anchor_off_fails(runs: PairRuns, t: ClaimThresholds) -> Result:
    _, gain_off, _ = _gains(runs, "anchor_off")
    _, gain_dense, _ = _gains(runs, "dense")
    f = t.anchor_off_max_gain_fraction
    contrast = stats.difference_interval(gain_off, gain_dense, scale=f)
    text = (
        f"anchor_off gain {_seed_mean(gain_off)} vs dense gain {_seed_mean(gain_dense)}; "
        f"gain_off - {f:g} x gain_dense {format_interval(contrast)}"
    )
    values = {
        "anchor_off_gain": _mean(gain_off),
        "dense_gain": _mean(gain_dense),
        "contrast": contrast.estimate,
    }
    return (check(f"anchor_off gain - {f:g} x dense gain", contrast, "at_most", 0.0),), text, values


def _method_kl_high(runs: PairRuns, t: ClaimThresholds) -> Result:
    tick, km, kd = _at_common_tick(runs, "method", "dense", "actor/kl_loss")
    ratio = stats.ratio_interval(km, kd, nonnegative=True)
    text = (
        f"method {_seed_mean(km, '.4g')} vs dense {_seed_mean(kd, '.4g')} nats at tick {tick}; "
        f"ratio {format_interval(ratio, '.3g')}"
    )
    values = {"tick": tick, "method": _mean(km), "dense": _mean(kd), "ratio": ratio.estimate}
    return (check("KL method / dense", ratio, "at_least", t.kl_min_ratio_method_dense),), text, values


def _controls_kl_low(runs: PairRuns, t: ClaimThresholds) -> Result:
    present = [c for c in ("prf_mask", "dropout") if cv.seed_series(runs, c, "actor/kl_loss")]
    if not present:
        raise _Missing("no prf_mask or dropout runs with actor/kl_loss")
    checks, parts, values = [], [], {}
    for control in present:
        tick, kc, km = _at_common_tick(runs, control, "method", "actor/kl_loss")
        ratio = stats.ratio_interval(kc, km, nonnegative=True)
        checks.append(check(f"KL {control} / method", ratio, "at_most", t.controls_max_kl_fraction))
        parts.append(
            f"{control} {_seed_mean(kc, '.4g')} vs method {_seed_mean(km, '.4g')} nats at tick {tick}, "
            f"ratio {format_interval(ratio, '.3g')}"
        )
        values |= {control: _mean(kc), f"method_at_{control}_tick": _mean(km), f"{control}_tick": tick}
    for control in ("prf_mask", "dropout"):  # the claim is about both: one not run cannot pass it
        if control not in present:
            missing = Interval(float("nan"), None, None, (0,), "none", note=f"{control} not run")
            checks.append(check(f"KL {control} / method", missing, "at_most", t.controls_max_kl_fraction))
            parts.append(f"not run: {control}")
    return tuple(checks), "; ".join(parts), values


def _corr_check(runs: PairRuns, condition: str, side: Side, threshold: float) -> Result:
    corr = stats.mean_interval(_mean_over_ticks(runs, condition, "mismatch/logprob_corr").values())
    text = f"{condition} mean corr {format_interval(corr, '.3f')}"
    return (check(f"{condition} mean corr", corr, side, threshold),), text, {condition: corr.estimate}


def _dense_corr(runs: PairRuns, t: ClaimThresholds) -> Result:
    return _corr_check(runs, "dense", "at_least", t.dense_min_corr)


def _method_corr(runs: PairRuns, t: ClaimThresholds) -> Result:
    return _corr_check(runs, "method", "at_most", t.method_max_corr)


def _same_sampler(runs: PairRuns, t: ClaimThresholds) -> Result:
    """The note's proposed fix has two sides: the gap closes (the log-probs agree by construction) and,
    the cost it names, the sampler that runs the codec still samples rollouts that learn (its score gain:
    a sampler whose codec distorts every rollout into a wrong answer leaves every advantage 0)."""
    name = "method_same_sampler"
    corr_checks, corr_text, values = _corr_check(runs, name, "at_least", t.same_sampler_min_corr)
    start, gain, ticks = _gains(runs, name)
    interval = stats.mean_interval(gain.values())
    text = (
        f"{corr_text}; its sampler's score {_seed_mean(start)} -> {_mean(start) + interval.estimate:.3f} "
        f"at tick {_ticks(ticks)}, gain {format_interval(interval)}"
    )
    gain_check = check(f"{name} score gain", interval, "at_least", t.same_sampler_min_gain)
    return (*corr_checks, gain_check), text, values | {"gain": interval.estimate}


def _gap_ratio(runs: PairRuns, t: ClaimThresholds) -> Result:
    gm, gd = (_mean_over_ticks(runs, c, "mismatch/prob_gap") for c in ("method", "dense"))
    ratio = stats.ratio_interval(gm, gd, nonnegative=True)
    text = (
        f"method {_seed_mean(gm, '.4g')} vs dense {_seed_mean(gd, '.4g')}; "
        f"ratio {format_interval(ratio, '.3g')}"
    )
    values = {"method": _mean(gm), "dense": _mean(gd), "ratio": ratio.estimate}
    return (check("prob gap method / dense", ratio, "at_least", t.gap_min_ratio),), text, values


def _async_clip(runs: PairRuns, t: ClaimThresholds) -> Result:
    metric = "mismatch/async_clip_frac_eps0.2"
    cd, cm = (stats.mean_interval(_mean_over_ticks(runs, c, metric).values()) for c in ("dense", "method"))
    checks = (
        check("dense async clip", cd, "at_most", t.dense_max_async_clip),
        check("method async clip", cm, "at_least", t.method_min_async_clip),
    )
    text = f"dense {format_interval(cd, '.2%')} vs method {format_interval(cm, '.1%')} of tokens"
    return checks, text, {"dense": cd.estimate, "method": cm.estimate}


def _validation(runs: PairRuns, t: ClaimThresholds) -> Result:
    """val/acc at the read tick, method - dense by seed: the note's Figure 3 (both cut at step 100)."""
    method, dense = _read(runs, "method", "val/acc"), _read(runs, "dense", "val/acc")
    return _method_vs_dense(method, dense, "val method - dense", t.val_max_gap)


def _beats_anchor_only(runs: PairRuns, t: ClaimThresholds) -> Result:
    """val/acc at the read tick, method - anchor_only (the method with no step between fires), by seed."""
    (vm, tm), (va, ta) = _read(runs, "method", "val/acc"), _read(runs, "anchor_only", "val/acc")
    diff = stats.difference_interval(vm, va)
    text = (
        f"method {_seed_mean(vm)} (tick {_ticks(tm)}) vs anchor_only {_seed_mean(va)} (tick {_ticks(ta)}); "
        f"diff {format_interval(diff)}"
    )
    values = {"method": _mean(vm), "anchor_only": _mean(va), "diff": diff.estimate}
    return (
        (check("val method - anchor_only", diff, "above", t.method_min_gain_over_anchor_only),),
        text,
        values,
    )


def _val_gains(runs: PairRuns, condition: str) -> tuple[dict[str, float], dict[str, int]]:
    """Per seed the val/acc gain at the read tick over the seed's first read (tick 0: the base model),
    and the tick read."""
    found = cv.per_seed(_series(runs, condition, "val/acc"), lambda s: cv.gain_at(s, runs.read_at()))
    if not found:
        raise _Missing(f"no {condition} read of val/acc at or before the read tick {runs.read_at()}")
    return {k: v for k, (_, v) in found.items()}, {k: t for k, (t, _) in found.items()}


def _async_method_starves(runs: PairRuns, t: ClaimThresholds) -> Result:
    """The note's prediction, trained: under one-step-off-policy rollouts with the sampler's log-probs as
    old, the clip drops most of the method's tokens (mean over its fast ticks of actor/effective_token_frac,
    per seed: ``runs.fast_ticks``), and val/acc gains less than dense_async's (gain over tick 0 at the read,
    by seed)."""
    frac = stats.mean_interval(_mean_over_ticks(runs, "method_async", "actor/effective_token_frac").values())
    (gm, tm), (gd, td) = _val_gains(runs, "method_async"), _val_gains(runs, "dense_async")
    diff = stats.difference_interval(gm, gd)
    checks = (
        check(
            "method_async effective token frac (fast ticks)",
            frac,
            "at_most",
            t.async_method_max_effective_frac,
        ),
        check("val gain method_async - dense_async", diff, "below", t.async_method_max_gain_vs_dense),
    )
    text = (
        f"method_async effective token frac (fast ticks) {format_interval(frac, '.1%')}; val gain "
        f"method_async {_seed_mean(gm)} (tick {_ticks(tm)}) vs dense_async {_seed_mean(gd)} "
        f"(tick {_ticks(td)}), diff {format_interval(diff)}"
    )
    values = {
        "effective_token_frac": frac.estimate,
        "method_async_gain": _mean(gm),
        "dense_async_gain": _mean(gd),
        "diff": diff.estimate,
    }
    return checks, text, values


def _async_correction_closes_gap(runs: PairRuns, t: ClaimThresholds) -> Result:
    """Per rollout correction of method_async run, val/acc at the read tick, dense_async - corrected, by
    seed, against the gap allowed; alternatives: the claim passes when any correction passes. With ``m``
    corrections each interval is at ``1 - (1 - 0.95) / m`` (Bonferroni): the best of ``m`` checks at 95%
    would pass a claim that holds for none about ``m`` times as often as one check."""
    vd, td = _read(runs, "dense_async", "val/acc")
    present = [c for c in ASYNC_CORRECTIONS if cv.seed_series(runs, c, "val/acc")]
    if not present:
        raise _Missing(f"no {', '.join(ASYNC_CORRECTIONS[:-1])} or {ASYNC_CORRECTIONS[-1]} runs with val/acc")
    confidence = bonferroni(stats.CONFIDENCE, len(present))
    checks, parts, values = [], [], {"dense_async": _mean(vd)}
    for correction in present:
        vc, tc = _read(runs, correction, "val/acc")
        diff = stats.difference_interval(vd, vc, confidence=confidence)
        checks.append(
            check(f"val dense_async - {correction}", diff, "at_most", t.async_correction_max_val_gap)
        )
        parts.append(f"{correction} {_seed_mean(vc)} (tick {_ticks(tc)}), diff {format_interval(diff)}")
        values |= {correction: _mean(vc), f"diff_{correction}": diff.estimate}
    passing = [c for c, k in zip(present, checks, strict=True) if k.status == PASS]
    values["passing"] = ", ".join(passing) or "none"
    absent = [c for c in ASYNC_CORRECTIONS if c not in present]
    text = f"dense_async {_seed_mean(vd)} (tick {_ticks(td)}) vs " + "; ".join(parts)
    text += f"; not run: {', '.join(absent)}" if absent else ""
    return tuple(checks), text, values


def bonferroni(confidence: float, m: int) -> float:
    """The level of each of ``m`` intervals, ``1 - (1 - confidence) / m``: the chance that any of them
    misses its value is then at most ``1 - confidence``, that of one interval at ``confidence``."""
    return 1 - (1 - confidence) / m


def _async_tis_costs_nothing(runs: PairRuns, t: ClaimThresholds) -> Result:
    """val/acc at the read tick, dense_async_tis - dense_async, by seed: token TIS where the only mismatch
    is one tick of policy lag."""
    (vt, tt), (vd, td) = _read(runs, "dense_async_tis", "val/acc"), _read(runs, "dense_async", "val/acc")
    diff = stats.difference_interval(vt, vd)
    text = (
        f"dense_async_tis {_seed_mean(vt)} (tick {_ticks(tt)}) vs dense_async {_seed_mean(vd)} "
        f"(tick {_ticks(td)}); diff {format_interval(diff)}"
    )
    values = {"dense_async_tis": _mean(vt), "dense_async": _mean(vd), "diff": diff.estimate}
    return (
        (check("val dense_async_tis - dense_async", diff, "within", t.async_tis_max_val_gap),),
        text,
        values,
    )


Evaluate = Callable[[PairRuns, ClaimThresholds], Result]


class ClaimSpec(NamedTuple):
    """One entry of ``CLAIMS``: the claim, the note's value, the threshold text from the thresholds, the
    evaluation, and how its checks combine (a plain 4-tuple is ``combine="all"``)."""

    claim: str
    note: str
    threshold: Callable[[ClaimThresholds], str]
    evaluate: Evaluate
    combine: Combine = "all"


# (claim, the note's value, threshold text from the thresholds, evaluation[, combine])
CLAIMS: tuple[ClaimSpec | tuple[str, str, Callable[[ClaimThresholds], str], Evaluate], ...] = (
    (
        "dense learns",
        "~0.35 at step 1 -> 0.709 at tick 100",
        lambda t: f"score(read) - start >= {t.dense_min_gain}",
        _dense_learns,
    ),
    (
        "method learns as well as dense",
        "0.715 method vs 0.709 dense at tick 100",
        lambda t: f"|method - dense| at read <= {t.method_max_score_gap}",
        _method_matches_dense,
    ),
    (
        "anchor off does not learn",
        "stays ~0.34 (no gain)",
        lambda t: f"gain <= {t.anchor_off_max_gain_fraction} x dense gain",
        _anchor_off_fails,
    ),
    (
        "method KL far above dense",
        "~7.1 nats method vs 0.009 dense at tick 150 (6.1 vs 0.004 at 100 and 50)",
        lambda t: f"KL method / dense at last common tick >= {t.kl_min_ratio_method_dense:g}",
        _method_kl_high,
    ),
    (
        "prf_mask and dropout KL stay low",
        "prf_mask 0.56, dropout ~0.11 vs method ~7.1 nats at tick 150",
        lambda t: f"KL <= {t.controls_max_kl_fraction} x method KL",
        _controls_kl_low,
    ),
    ("dense log-probs agree", "corr ~1.0", lambda t: f"mean corr >= {t.dense_min_corr}", _dense_corr),
    (
        "method log-probs do not agree",
        "corr ~0.15",
        lambda t: f"mean corr <= {t.method_max_corr}",
        _method_corr,
    ),
    (
        "prob gap method >> dense",
        "0.77-0.93 vs ~0.002 (> 300x)",
        lambda t: f"gap method / dense >= {t.gap_min_ratio:g}",
        _gap_ratio,
    ),
    (
        "async clip at eps 0.2: dense keeps, method drops",
        "< 1% dense vs > 65% compressed (5x clip: ~61%)",
        lambda t: f"dense <= {t.dense_max_async_clip:.0%} and method >= {t.method_min_async_clip:.0%}",
        _async_clip,
    ),
    (
        "sampler on the trainer's codec closes the gap and still learns",
        "proposed fix, not run in the note ('compressing the sampler could distort the sampling itself')",
        lambda t: (
            f"method_same_sampler mean corr >= {t.same_sampler_min_corr} and score gain >= "
            f"{t.same_sampler_min_gain:g}"
        ),
        _same_sampler,
    ),
    (
        "validation: method as good as dense",
        "MATH500 0.679 method vs 0.674 dense at tick 100",
        lambda t: f"|val method - val dense| at read <= {t.val_max_gap}",
        _validation,
    ),
    (
        "the compressed circuit learns: method beats anchor_only",
        "not in the note (a control: the anchor's dense updates alone)",
        lambda t: f"val method - val anchor_only at read > {t.method_min_gain_over_anchor_only:g}",
        _beats_anchor_only,
    ),
    (
        "asynchronous method starves: few tokens carry gradient, val gains less than dense_async",
        "the note's open problem: 'clipping would throw away most of the compressed update' (not trained)",
        lambda t: (
            f"method_async effective token frac <= {t.async_method_max_effective_frac:g} and val gain "
            f"method_async - dense_async < {t.async_method_max_gain_vs_dense:g}"
        ),
        _async_method_starves,
    ),
    ClaimSpec(
        "a rollout correction brings method_async's val to dense_async's",
        "not in the note (verl's corrections: token TIS, IcePop, sequence rejection)",
        lambda t: (
            f"val dense_async - corrected at read <= {t.async_correction_max_val_gap:g} for any of "
            f"{', '.join(ASYNC_CORRECTIONS)} (Bonferroni: each interval at 1 - 0.05/m, m corrections run)"
        ),
        _async_correction_closes_gap,
        combine="any",
    ),
    (
        "the correction costs nothing without compression: dense_async_tis as good as dense_async",
        "not in the note (a control)",
        lambda t: f"|val dense_async_tis - dense_async| at read <= {t.async_tis_max_val_gap:g}",
        _async_tis_costs_nothing,
    ),
)


def evaluate_claims(runs: PairRuns, thresholds: ClaimThresholds | None = None) -> list[Claim]:
    """Every claim of ``CLAIMS`` on one pair, numbered from 1: PASS, MISS, INCONCLUSIVE or n/a."""
    t = thresholds or ClaimThresholds()
    out = []
    for number, entry in enumerate(CLAIMS, start=1):
        claim, note, threshold, evaluate, combine = ClaimSpec(*entry)
        try:
            checks, value, values = evaluate(runs, t)
        except _Missing as missing:
            out.append(
                Claim(number, claim, note, threshold(t), str(missing), NA, "inputs missing", combine=combine)
            )
            continue
        except _Unfinished as unfinished:
            text = str(unfinished)
            out.append(Claim(number, claim, note, threshold(t), text, INCONCLUSIVE, text, combine=combine))
            continue
        status = deciding(checks, combine).status
        alone = len(checks) == 1 and combine == "all"
        reason = "; ".join(c.reason if alone else f"{c.quantity}: {c.reason}" for c in checks)
        if combine == "any":
            passing = [c.quantity for c in checks if c.status == PASS]
            reason = f"passing: {', '.join(passing) or 'none'}; {reason}"
        out.append(Claim(number, claim, note, threshold(t), value, status, reason, checks, values, combine))
    return out
