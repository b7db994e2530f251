"""The note's qualitative claims, checked on this run's curves: the note's value, the threshold, PASS or MISS.

Every threshold lives in ``ClaimThresholds``. Curves are seed means (``curves.aggregate``). "The read tick"
is the pair's ``read_at`` tag (the last logged tick not after it), or the last tick when runs carry none.
A claim whose runs or metrics are missing is ``n/a`` and says what is missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

from commrl.report import curves as cv
from commrl.report.runs import PairRuns, ReportInputError

PASS, MISS, NA = "PASS", "MISS", "n/a"


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
    val_max_gap: float = 0.05

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
class Claim:
    number: int
    claim: str
    note: str
    threshold: str
    value: str
    status: str
    values: dict[str, float | None] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


class _Missing(Exception):
    """A claim's inputs are not in the store; the message says which."""


def _curve(runs: PairRuns, condition: str, metric: str) -> cv.Curve:
    curve = cv.condition_curve(runs, condition, metric)
    if curve is None:
        raise _Missing(f"no {condition} runs with {metric}")
    return curve


def _read(runs: PairRuns, curve: cv.Curve) -> tuple[int, float]:
    found = cv.value_at(curve, runs.read_at())
    if found is None:
        raise _Missing(f"no tick logged at or before the read tick {runs.read_at()}")
    return found


def _gain(runs: PairRuns, condition: str) -> tuple[float, float, int, float]:
    """``(start, score at read, read tick, gain)``, gain = score(read) - mean of the first three ticks."""
    curve = _curve(runs, condition, "score/mean")
    tick, score = _read(runs, curve)
    start = cv.start_mean(curve)
    return start, score, tick, score - start


def _ratio(a: float, b: float) -> float:
    if b == 0:
        return math.inf if a > 0 else math.nan
    return a / b


def _status(ok: bool) -> str:
    return PASS if ok else MISS


def _kl_at_common(runs: PairRuns, condition: str, other: str) -> tuple[int, float, float]:
    a, b = _curve(runs, condition, "actor/kl_loss"), _curve(runs, other, "actor/kl_loss")
    tick = cv.last_common_tick(a, b)
    if tick is None:
        raise _Missing(f"{condition} and {other} share no logged tick of actor/kl_loss")
    return tick, cv.exact_at(a, tick), cv.exact_at(b, tick)


def _dense_learns(runs: PairRuns, t: ClaimThresholds) -> tuple[str, str, dict]:
    start, score, tick, gain = _gain(runs, "dense")
    text = f"dense {start:.3f} -> {score:.3f} at tick {tick} (gain {gain:.3f})"
    values = {"start": start, "score": score, "tick": tick, "gain": gain}
    return _status(gain >= t.dense_min_gain), text, values


def _method_matches_dense(runs: PairRuns, t: ClaimThresholds) -> tuple[str, str, dict]:
    tm, sm = _read(runs, _curve(runs, "method", "score/mean"))
    td, sd = _read(runs, _curve(runs, "dense", "score/mean"))
    gap = abs(sm - sd)
    return (
        _status(gap <= t.method_max_score_gap),
        f"method {sm:.3f} (tick {tm}) vs dense {sd:.3f} (tick {td}), |diff| {gap:.3f}",
        {"method": sm, "dense": sd, "method_tick": tm, "dense_tick": td, "diff": gap},
    )


def _anchor_off_fails(runs: PairRuns, t: ClaimThresholds) -> tuple[str, str, dict]:
    *_, gain_off = _gain(runs, "anchor_off")
    _, _, _, gain_dense = _gain(runs, "dense")
    return (
        _status(gain_off <= t.anchor_off_max_gain_fraction * gain_dense),
        f"anchor_off gain {gain_off:.3f} vs dense gain {gain_dense:.3f}",
        {"anchor_off_gain": gain_off, "dense_gain": gain_dense},
    )


def _method_kl_high(runs: PairRuns, t: ClaimThresholds) -> tuple[str, str, dict]:
    tick, km, kd = _kl_at_common(runs, "method", "dense")
    ratio = _ratio(km, kd)
    return (
        _status(ratio >= t.kl_min_ratio_method_dense),
        f"method {km:.4g} vs dense {kd:.4g} nats at tick {tick} (ratio {ratio:.3g})",
        {"tick": tick, "method": km, "dense": kd, "ratio": ratio},
    )


def _controls_kl_low(runs: PairRuns, t: ClaimThresholds) -> tuple[str, str, dict]:
    present = [c for c in ("prf_mask", "dropout") if cv.condition_curve(runs, c, "actor/kl_loss") is not None]
    if not present:
        raise _Missing("no prf_mask or dropout runs with actor/kl_loss")
    ok, parts, values = True, [], {}
    for control in present:
        tick, kc, km = _kl_at_common(runs, control, "method")
        ok &= kc <= t.controls_max_kl_fraction * km
        parts.append(f"{control} {kc:.4g} vs method {km:.4g} nats at tick {tick}")
        values |= {control: kc, f"method_at_{control}_tick": km, f"{control}_tick": tick}
    return _status(ok), "; ".join(parts), values


def _mean_of(runs: PairRuns, condition: str, metric: str) -> float:
    value = cv.mean_over_ticks(_curve(runs, condition, metric))
    if math.isnan(value):
        raise _Missing(f"{condition} {metric} is NaN at every tick")
    return value


def _dense_corr(runs: PairRuns, t: ClaimThresholds) -> tuple[str, str, dict]:
    corr = _mean_of(runs, "dense", "mismatch/logprob_corr")
    return _status(corr >= t.dense_min_corr), f"dense mean corr {corr:.3f}", {"dense": corr}


def _method_corr(runs: PairRuns, t: ClaimThresholds) -> tuple[str, str, dict]:
    corr = _mean_of(runs, "method", "mismatch/logprob_corr")
    return _status(corr <= t.method_max_corr), f"method mean corr {corr:.3f}", {"method": corr}


def _gap_ratio(runs: PairRuns, t: ClaimThresholds) -> tuple[str, str, dict]:
    gm, gd = (_mean_of(runs, c, "mismatch/prob_gap") for c in ("method", "dense"))
    ratio = _ratio(gm, gd)
    return (
        _status(ratio >= t.gap_min_ratio),
        f"method {gm:.4g} vs dense {gd:.4g} (ratio {ratio:.3g})",
        {"method": gm, "dense": gd, "ratio": ratio},
    )


def _async_clip(runs: PairRuns, t: ClaimThresholds) -> tuple[str, str, dict]:
    cd, cm = (_mean_of(runs, c, "mismatch/async_clip_frac_eps0.2") for c in ("dense", "method"))
    return (
        _status(cd <= t.dense_max_async_clip and cm >= t.method_min_async_clip),
        f"dense {cd:.1%} vs method {cm:.1%} of tokens",
        {"dense": cd, "method": cm},
    )


def _same_sampler(runs: PairRuns, t: ClaimThresholds) -> tuple[str, str, dict]:
    corr = _mean_of(runs, "method_same_sampler", "mismatch/logprob_corr")
    return (
        _status(corr >= t.same_sampler_min_corr),
        f"method_same_sampler mean corr {corr:.3f}",
        {"method_same_sampler": corr},
    )


def _validation(runs: PairRuns, t: ClaimThresholds) -> tuple[str, str, dict]:
    best = {c: cv.best(_curve(runs, c, "val/acc")) for c in ("method", "dense")}
    if any(b is None for b in best.values()):
        raise _Missing("val/acc is NaN everywhere")
    (tm, vm), (td, vd) = best["method"], best["dense"]
    gap = abs(vm - vd)
    return (
        _status(gap <= t.val_max_gap),
        f"method {vm:.3f} (tick {tm}) vs dense {vd:.3f} (tick {td})",
        {"method": vm, "dense": vd, "method_tick": tm, "dense_tick": td, "diff": gap},
    )


Check = Callable[[PairRuns, ClaimThresholds], tuple[str, str, dict]]
# (claim, the note's value, threshold text from the thresholds, check)
CLAIMS: tuple[tuple[str, str, Callable[[ClaimThresholds], str], Check], ...] = (
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
        "6.1 nats method vs 0.009 dense (0.004 at tick 50)",
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
        "sampler on the trainer's codec closes the gap",
        "proposed fix, not run in the note",
        lambda t: f"method_same_sampler mean corr >= {t.same_sampler_min_corr}",
        _same_sampler,
    ),
    (
        "validation: method as good as dense",
        "MATH500 0.679 method vs 0.674 dense at tick 100",
        lambda t: f"|best val method - best val dense| <= {t.val_max_gap}",
        _validation,
    ),
)


def evaluate_claims(runs: PairRuns, thresholds: ClaimThresholds | None = None) -> list[Claim]:
    """Every claim of ``CLAIMS`` on one pair, numbered from 1, with PASS, MISS or n/a."""
    t = thresholds or ClaimThresholds()
    out = []
    for number, (claim, note, threshold, check) in enumerate(CLAIMS, start=1):
        try:
            status, value, values = check(runs, t)
        except _Missing as missing:
            status, value, values = NA, str(missing), {}
        out.append(Claim(number, claim, note, threshold(t), value, status, values))
    return out
