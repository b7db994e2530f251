"""Seed statistics of the report: a mean, a difference and a ratio over seeds with a 95% interval, and the
three-way verdict of a claim on such an interval; and the median of a benchmark's repetitions with its
distribution-free interval (``median_interval``).

The interval method depends on the number of seeds ``n`` (the smaller side for two conditions):

- ``n = 1``: no interval (``low = high = None``); a verdict on it is INCONCLUSIVE ("n=1: no interval").
- ``2 <= n < MIN_BOOTSTRAP_N`` (20): Student's t. One condition, or two paired by seed:
  ``mean ± t_{n-1, 0.975} s / sqrt(n)``; two unpaired conditions: Welch's interval; a ratio: Fieller's
  interval. The bootstrap cannot be trusted at these sizes: a resample of ``n`` seeds has at most
  ``C(2n-1, n)`` distinct values (3 at ``n = 2``), a percentile or BCa interval never leaves the range of
  the sample, and it uses the normal quantile where ``t_{n-1}`` is due. In 400 simulated samples from a
  normal, the nominal 95% BCa interval of scipy 1.17 covered the mean in 73% (n=3), 86% (n=5), 89% (n=10)
  and 93% (n=20) of them, the t-interval in 94-97% at every n; on an exponential (skewed) t still covered
  at least as well as BCa up to n=20. So t, which is exact for normal seeds and robust to mild skew at
  small n.
- ``n >= MIN_BOOTSTRAP_N``: ``scipy.stats.bootstrap`` with ``method="BCa"`` (bias-corrected and
  accelerated; second-order accurate, so it follows the skew of bounded or heavy-tailed metrics such as
  KL, which matters because verdicts are one-sided; the percentile interval is only first-order), 9999
  resamples from a fixed ``rng`` (``BOOTSTRAP_SEED``): the same inputs give the same interval. (From
  n=20 on skewed seeds BCa splits its misses more evenly between the tails than t: exponential, n=30,
  4.4% of 1000 intervals below the mean against t's 5.9%.)
- Zero spread (every seed the same value, ``n >= 2``): the interval is the point ``[v, v]`` (the t
  half-width is 0; BCa is undefined there, its jackknife has no variance, so it is not called).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from scipy import stats as sps

PASS, MISS, INCONCLUSIVE = "PASS", "MISS", "INCONCLUSIVE"
CONFIDENCE = 0.95
MIN_BOOTSTRAP_N = 20
N_RESAMPLES = 9999
BOOTSTRAP_SEED = 20260
BOOTSTRAP_BATCH = 1000  # resamples held in memory at once (curves: ticks x seeds x batch floats)
ZERO_SPREAD = "zero spread across seeds: the interval is the point"

Side = Literal["at_least", "above", "at_most", "below", "within"]


@dataclass(frozen=True)
class Interval:
    """An estimate over seeds and its interval (``low``/``high`` None when there is none).

    ``sizes``: seeds (a benchmark's repetitions) behind it, one entry per sample (two for unpaired
    conditions, one when paired); ``method``: ``t``, ``welch``, ``fieller`` (Welch's degrees of freedom
    when unpaired), ``bca``, ``order`` (a median's order statistics) or ``none``; ``note``: why there is
    no interval, or what is special about it.
    """

    estimate: float
    low: float | None
    high: float | None
    sizes: tuple[int, ...]
    method: str
    paired: bool = False
    note: str = ""
    confidence: float = CONFIDENCE

    @property
    def n(self) -> int:
        """The smallest number of seeds behind the estimate."""
        return min(self.sizes)

    @property
    def half_width(self) -> float | None:
        """``(high - low) / 2``; None without an interval."""
        return None if self.low is None or self.high is None else (self.high - self.low) / 2

    @property
    def symmetric(self) -> bool:
        """Whether the interval is ``estimate ± half_width`` (t, Welch, a point), to rounding."""
        if self.low is None or self.high is None:
            return False
        if not (np.isfinite(self.low) and np.isfinite(self.high)):
            return False
        up, down = self.high - self.estimate, self.estimate - self.low
        return abs(up - down) <= 1e-9 * max(1.0, abs(self.estimate), self.high - self.low)

    def as_dict(self) -> dict:
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "sizes": list(self.sizes),
            "method": self.method,
            "paired": self.paired,
            "confidence": self.confidence,
            "note": self.note,
        }


@dataclass(frozen=True)
class Bands:
    """Per column (tick) of a seeds x ticks table: the seed mean, its interval (NaN with under two seeds)
    and the number of seeds that logged it."""

    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: np.ndarray


def _finite(values: Iterable[float], what: str) -> np.ndarray:
    x = np.asarray(list(values), dtype=np.float64)
    if x.size == 0:
        raise ValueError(f"{what}: no values; pass at least one seed's value")
    if not np.all(np.isfinite(x)):
        raise ValueError(
            f"{what}: non-finite value(s) {x[~np.isfinite(x)].tolist()}; drop the seeds that did not log it"
        )
    return x


def _quantile(confidence: float, df: float | np.ndarray) -> np.ndarray:
    """``t_{df, (1 + confidence) / 2}``."""
    return sps.t.ppf((1 + confidence) / 2, df)


def _mean_rows(x: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """Mean and interval of each row of ``x`` (rows x n seeds, n >= 2, finite): t below
    ``MIN_BOOTSTRAP_N``, else BCa; a row of equal values gets the point ``[mean, mean]``."""
    n = x.shape[1]
    mean = x.mean(axis=1)
    if n < MIN_BOOTSTRAP_N:
        half = _quantile(confidence, n - 1) * x.std(axis=1, ddof=1) / np.sqrt(n)
        return mean, mean - half, mean + half, "t"
    low, high = mean.copy(), mean.copy()
    spread = np.ptp(x, axis=1) > 0
    if spread.any():
        result = sps.bootstrap(
            (x[spread],),
            np.mean,
            axis=-1,
            confidence_level=confidence,
            method="BCa",
            n_resamples=N_RESAMPLES,
            batch=BOOTSTRAP_BATCH,
            rng=np.random.default_rng(BOOTSTRAP_SEED),
        )
        low[spread], high[spread] = result.confidence_interval
    return mean, low, high, "bca"


def _no_interval(estimate: float, sizes: tuple[int, ...], note: str, paired: bool = False) -> Interval:
    return Interval(float(estimate), None, None, sizes, "none", paired, note)


def _zero_spread_note(low: float, high: float) -> str:
    return ZERO_SPREAD if low == high else ""


def mean_interval(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    """The seed mean ``x_bar = (1/n) sum_s x_s`` and its interval (t below 20 seeds, BCa from 20)."""
    x = _finite(values, "mean_interval")
    if len(x) == 1:
        return _no_interval(x[0], (1,), "n=1: no interval")
    mean, low, high, method = _mean_rows(x[None, :], confidence)
    lo, hi = float(low[0]), float(high[0])
    return Interval(float(mean[0]), lo, hi, (len(x),), method, False, _zero_spread_note(lo, hi), confidence)


def median_interval(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    """The median of ``n`` repeated measurements (a benchmark's per-repetition times or ratios) and its
    distribution-free interval ``[x_(k), x_(n+1-k)]``: the order statistics with the largest ``k`` whose
    coverage ``1 - 2 P(B <= k - 1)``, ``B ~ Binomial(n, 1/2)``, is at least ``confidence``. Exact for any
    continuous distribution of independent repetitions, so no normality is assumed (a timing's noise is
    skewed: a busy machine only adds to it). Under 6 values at 95% (``1 - 2^(1-n) < confidence``) not even
    ``[min, max]`` covers enough: no interval. ``note`` names the order statistics and their coverage.
    """
    x = np.sort(_finite(values, "median_interval"))
    n = len(x)
    estimate = float(np.median(x))
    k = 0  # candidate k + 1 covers 1 - 2 P(B <= k)
    while k < n // 2 and 1 - 2 * sps.binom.cdf(k, n, 0.5) >= confidence:
        k += 1
    if k == 0:
        needed = next(m for m in range(1, 64) if 1 - 2 * 0.5**m >= confidence)
        return _no_interval(estimate, (n,), f"n={n}: a median's {confidence:.0%} interval needs {needed}")
    coverage = 1 - 2 * float(sps.binom.cdf(k - 1, n, 0.5))
    note = f"order statistics {k} and {n + 1 - k} of {n}: coverage {coverage:.1%}"
    return Interval(estimate, float(x[k - 1]), float(x[n - k]), (n,), "order", False, note, confidence)


def mean_bands(table: np.ndarray, confidence: float = CONFIDENCE) -> Bands:
    """Column-wise ``mean_interval`` of a seeds x ticks table, NaN where a seed did not log a tick.

    Columns with the same seeds present are computed together (one vectorised call per pattern).
    """
    table = np.asarray(table, dtype=np.float64)
    present = np.isfinite(table)
    n = present.sum(axis=0)
    mean = np.full(table.shape[1], np.nan)
    low, high = mean.copy(), mean.copy()
    logged = n > 0
    mean[logged] = np.where(present, table, 0.0)[:, logged].sum(axis=0) / n[logged]
    patterns: dict[bytes, list[int]] = {}
    for j in np.nonzero(n >= 2)[0]:
        patterns.setdefault(present[:, j].tobytes(), []).append(int(j))
    for columns in patterns.values():
        rows = table[present[:, columns[0]]][:, columns].T
        _, low[columns], high[columns], _ = _mean_rows(rows, confidence)
    return Bands(mean, low, high, n)


def _pair(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray, bool]:
    """The two samples, in seed order when ``a`` and ``b`` have the same seeds (then paired)."""
    paired = set(a) == set(b)
    seeds_a = sorted(a) if paired else list(a)
    xa = _finite((a[s] for s in seeds_a), "condition a")
    xb = _finite((b[s] for s in (seeds_a if paired else list(b))), "condition b")
    return xa, xb, paired


def _unpaired_short(sizes: tuple[int, int]) -> str:
    return f"unpaired n={sizes[0]} vs {sizes[1]}: no interval (each side needs 2 seeds)"


def _two_sample_bca(
    xa: np.ndarray,
    xb: np.ndarray,
    statistic: Callable[[np.ndarray, np.ndarray, int], np.ndarray],
    paired: bool,
    confidence: float,
) -> tuple[float, float]:
    """The BCa interval of ``statistic(a, b, axis)``, resampling seeds jointly when paired."""
    result = sps.bootstrap(
        (xa, xb),
        statistic,
        paired=paired,
        axis=-1,
        confidence_level=confidence,
        method="BCa",
        n_resamples=N_RESAMPLES,
        batch=BOOTSTRAP_BATCH,
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def difference_interval(
    a: Mapping[str, float], b: Mapping[str, float], scale: float = 1.0, confidence: float = CONFIDENCE
) -> Interval:
    """``mean(a) - c mean(b)`` (``c = scale``) over seeds (``seed -> value``) and its interval.

    Paired when ``a`` and ``b`` have the same seeds: the interval of the mean of ``d_s = a_s - c b_s``.
    Otherwise unpaired (a partial overlap is not cut down to the shared seeds): Welch,
    ``se^2 = s_a^2/n_a + c^2 s_b^2/n_b`` with Welch-Satterthwaite degrees of freedom, below 20 seeds a
    side; a two-sample BCa bootstrap from 20.
    """
    xa, xb, paired = _pair(a, b)
    if paired:
        return replace(mean_interval(xa - scale * xb, confidence), paired=True)
    estimate = float(xa.mean() - scale * xb.mean())
    sizes = (len(xa), len(xb))
    if min(sizes) < 2:
        return _no_interval(estimate, sizes, _unpaired_short(sizes))
    va, vb = xa.var(ddof=1) / sizes[0], scale**2 * xb.var(ddof=1) / sizes[1]
    if va + vb > 0 and min(sizes) >= MIN_BOOTSTRAP_N:

        def contrast(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
            return x.mean(axis=axis) - scale * y.mean(axis=axis)

        low, high = _two_sample_bca(xa, xb, contrast, False, confidence)
        return Interval(estimate, low, high, sizes, "bca", False, "", confidence)
    return _welch(estimate, float(va), float(vb), sizes, confidence)


def _welch(estimate: float, va: float, vb: float, sizes: tuple[int, int], confidence: float) -> Interval:
    """``estimate ± t_{df} sqrt(va + vb)`` with the Welch-Satterthwaite
    ``df = (va + vb)^2 / (va^2 / (n_a - 1) + vb^2 / (n_b - 1))`` (``va``, ``vb``: squared standard errors)."""
    if va + vb == 0:
        return Interval(estimate, estimate, estimate, sizes, "welch", False, ZERO_SPREAD, confidence)
    df = (va + vb) ** 2 / (va**2 / (sizes[0] - 1) + vb**2 / (sizes[1] - 1))
    half = float(_quantile(confidence, df) * np.sqrt(va + vb))
    return Interval(estimate, estimate - half, estimate + half, sizes, "welch", False, "", confidence)


def standard_error(interval: Interval) -> float | None:
    """The standard error behind a t interval of a seed mean, ``s / sqrt(n) = half_width / t_{n-1}``;
    None for any other interval (BCa, Welch, Fieller, none), whose half-width is no such multiple."""
    if interval.method != "t" or interval.half_width is None or interval.n < 2 or len(interval.sizes) != 1:
        return None
    return float(interval.half_width / _quantile(interval.confidence, interval.n - 1))


def summary_difference(a: Interval, b: Interval) -> Interval | None:
    """``mean(a) - mean(b)`` of two independent seed means given only as t intervals (e.g. read back
    from two reports' ``tables.json``), with Welch's interval on the standard errors that
    ``standard_error`` recovers: the same interval ``difference_interval`` gives on the seeds themselves
    when unpaired. None when either side is not a t interval of two or more seeds."""
    se_a, se_b = standard_error(a), standard_error(b)
    if se_a is None or se_b is None:
        return None
    confidence = min(a.confidence, b.confidence)
    return _welch(a.estimate - b.estimate, se_a**2, se_b**2, (a.n, b.n), confidence)


def _ratio(a: float, b: float) -> float:
    if b == 0:
        return float(np.sign(a) * np.inf) if a != 0 else float("nan")
    return a / b


def cut_below(interval: Interval, floor: float, note: str) -> Interval:
    """``interval`` intersected with ``[floor, inf)``, for an estimand ``mu`` that is never below ``floor``
    (a time, a ratio of non-negative means); ``note`` (``{low}``: the lower end it replaced) is added to the
    interval's note when the cut moves an end.

    ``P(mu in [max(L, floor), U]) = P(mu in [L, U])`` because ``mu >= floor`` always, so the cut interval
    has the coverage of the interval it cuts, without values the estimand cannot take.
    """
    if interval.low is None or interval.high is None or interval.low >= floor:
        return interval
    text = note.format(low=interval.low)
    return replace(
        interval,
        low=floor,
        high=max(interval.high, floor),
        note=f"{text}; {interval.note}" if interval.note else text,
    )


NONNEGATIVE_RATIO = "cut at 0, a ratio of non-negative quantities (the lower end was {low:.4g})"


def ratio_interval(
    a: Mapping[str, float],
    b: Mapping[str, float],
    confidence: float = CONFIDENCE,
    nonnegative: bool = False,
) -> Interval:
    """``rho = mean(a) / mean(b)`` over seeds and its interval: Fieller's below 20 seeds, BCa from 20;
    ``nonnegative`` (both quantities are never below 0: times, KL, bytes) cuts it at 0 (``cut_below``).

    Fieller: the ``rho`` whose contrast ``a_bar - rho b_bar`` a t-test does not reject,
    ``(a_bar - rho b_bar)^2 <= q (v_aa - 2 rho v_ab + rho^2 v_bb)``, ``q = t^2``, ``v`` the variances of
    the means (``v_ab`` the covariance when paired by seed, else 0, Welch's degrees of freedom at
    ``rho_hat``). Bounded when ``b_bar^2 > q v_bb`` (the denominator is clearly away from 0); otherwise the
    set is the whole line, or two rays ``(-inf, r1] and [r2, inf)`` when the numerator is clearly away from 0
    (the quadratic's discriminant > 0): the interval is ``(-inf, inf)`` and says so, but for a ``nonnegative``
    ratio with ``r1 < 0`` it is ``[r2, inf)``, the set's non-negative part (a ratio over a noisy denominator
    near 0, dense's KL, is then bounded below, not "anywhere above 0"). A denominator that is 0 in every
    seed gives ``±inf`` when the numerator's interval excludes 0.
    """
    interval = _ratio_interval(a, b, confidence, nonnegative)
    return cut_below(interval, 0.0, NONNEGATIVE_RATIO) if nonnegative else interval


def _ratio_interval(
    a: Mapping[str, float], b: Mapping[str, float], confidence: float, nonnegative: bool
) -> Interval:
    xa, xb, paired = _pair(a, b)
    ma, mb = float(xa.mean()), float(xb.mean())
    estimate = _ratio(ma, mb)
    sizes = (len(xa),) if paired else (len(xa), len(xb))
    if min(sizes) < 2:
        note = "n=1: no interval" if paired else _unpaired_short((len(xa), len(xb)))
        return _no_interval(estimate, sizes, note, paired)
    if not np.any(xb):
        numerator = mean_interval(xa, confidence)
        note = "the denominator is 0 in every seed"
        if numerator.low > 0 or numerator.high < 0:
            return Interval(estimate, estimate, estimate, sizes, "fieller", paired, note, confidence)
        note += " and the numerator's interval holds 0"
        return Interval(estimate, -np.inf, np.inf, sizes, "fieller", paired, note, confidence)
    if min(sizes) >= MIN_BOOTSTRAP_N and (np.ptp(xa) > 0 or np.ptp(xb) > 0):

        def ratio(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
            return x.mean(axis=axis) / y.mean(axis=axis)

        low, high = _two_sample_bca(xa, xb, ratio, paired, confidence)
        return Interval(estimate, low, high, sizes, "bca", paired, "", confidence)
    if mb == 0:  # Welch's degrees of freedom at rho_hat = ±inf are undefined: the interval is unbounded
        note = "unbounded: the denominator's mean is 0"
        return Interval(estimate, -np.inf, np.inf, sizes, "fieller", paired, note, confidence)
    if paired:
        n = len(xa)
        cov = np.cov(xa, xb, ddof=1)
        v_aa, v_bb, v_ab, df = cov[0, 0] / n, cov[1, 1] / n, cov[0, 1] / n, n - 1
    else:
        v_aa, v_bb, v_ab = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb), 0.0
        num = (v_aa + estimate**2 * v_bb) ** 2
        den = v_aa**2 / (len(xa) - 1) + (estimate**2 * v_bb) ** 2 / (len(xb) - 1)
        df = num / den if den > 0 else np.inf
    q = float(_quantile(confidence, df)) ** 2
    quad, lin, const = mb**2 - q * v_bb, -2 * (ma * mb - q * v_ab), ma**2 - q * v_aa
    disc = lin**2 - 4 * quad * const
    if quad < 0 and disc > 0 and nonnegative:
        # the set lies outside the roots, (-inf, r1] and [r2, inf): [r2, inf) holds its ratios >= 0 if r1 < 0
        r1, r2 = sorted(
            (float((-lin - np.sqrt(disc)) / (2 * quad)), float((-lin + np.sqrt(disc)) / (2 * quad)))
        )
        if r1 < 0:
            note = (
                f"unbounded above: the denominator's interval holds 0 and the set is (-inf, {r1:.4g}] and "
                f"[{r2:.4g}, inf), of which a non-negative ratio takes the second"
            )
            return Interval(estimate, max(r2, 0.0), np.inf, sizes, "fieller", paired, note, confidence)
    if quad <= 0:
        note = "unbounded: the denominator's interval holds 0"
        return Interval(estimate, -np.inf, np.inf, sizes, "fieller", paired, note, confidence)
    root = np.sqrt(max(disc, 0.0))
    low, high = float((-lin - root) / (2 * quad)), float((-lin + root) / (2 * quad))
    note = _zero_spread_note(low, high)
    return Interval(estimate, low, high, sizes, "fieller", paired, note, confidence)


def _bound(value: float, threshold: float) -> str:
    """``value`` to 4 significant digits, or as many more as it takes not to print the threshold (or its
    negative) for a value that is not it: ``0.049996`` against 0.05 reads 0.049996, not 0.05."""
    for digits in range(4, 17):
        text = f"{value:.{digits}g}"
        if value in (threshold, -threshold) or float(text) not in (threshold, -threshold):
            return text
    return repr(value)


def verdict(interval: Interval, side: Side, threshold: float) -> tuple[str, str]:
    """``(status, reason)`` of the claim ``x >= threshold`` (``at_least``), ``x > threshold`` (``above``),
    ``x <= threshold`` (``at_most``), ``x < threshold`` (``below``) or ``|x| <= threshold`` (``within``) on
    the interval ``[l, h]`` of ``x``.

    PASS when ``[l, h]`` lies entirely on the claim's side (``l >= thr``; ``l > thr``; ``h <= thr``;
    ``h < thr``; ``-thr <= l, h <= thr``), MISS when entirely on the other (``h < thr``; ``h <= thr``;
    ``l > thr``; ``l >= thr``; ``l > thr`` or ``h < -thr``), INCONCLUSIVE when it straddles the threshold,
    or when there is no interval (one seed). So a strict claim on a zero-spread interval at its threshold
    (every seed tied) is a MISS.
    """
    low, high = interval.low, interval.high
    if low is None or high is None:
        return INCONCLUSIVE, interval.note or f"n={interval.n}: no interval"
    t = threshold
    ci = f"{100 * interval.confidence:.3g}% CI [{_bound(low, t)}, {_bound(high, t)}]"
    rules = {
        "at_least": (low >= t, high < t, f">= {t:g}", f"< {t:g}", f"straddles {t:g}"),
        "above": (low > t, high <= t, f"> {t:g}", f"<= {t:g}", f"straddles {t:g}"),
        "at_most": (high <= t, low > t, f"<= {t:g}", f"> {t:g}", f"straddles {t:g}"),
        "below": (high < t, low >= t, f"< {t:g}", f">= {t:g}", f"straddles {t:g}"),
        "within": (
            -t <= low and high <= t,
            low > t or high < -t,
            f"inside ±{t:g}",
            f"outside ±{t:g}",
            f"straddles ±{t:g}",
        ),
    }
    if side not in rules:
        raise ValueError(f"verdict: side {side!r} is not one of {', '.join(rules)}")
    passed, missed, on_side, off_side, across = rules[side]
    if passed:
        return PASS, f"{ci} {on_side}"
    if missed:
        return MISS, f"{ci} {off_side}"
    return INCONCLUSIVE, f"{ci} {across}"
