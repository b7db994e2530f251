"""Two reports of the same study side by side: does another run of it (another machine, a fresh clone,
other float kernels) fall inside this one's intervals, cell by cell and claim by claim?

``compare_reports(base_dir, other_dir)`` reads each report's ``tables.json`` and ``claims.json`` (what
``commrl report`` writes; the README's published report is ``docs/tiny-report``) and pairs every interval
cell (same pair, table, row and column) and every claim (same pair and number). Per cell:

- ``identical``: the same mean and interval, to the last bit;
- ``inside``: the other run's seed mean lies in the base's 95% interval, ``l_b <= x_o <= h_b``. When the
  two runs differ only by noise of one spread, ``x_o - x_b`` has twice the variance of a mean, so this
  holds with probability ``P(|T_{n-1}| <= t_{n-1, 0.975} / sqrt(2))`` (``expected_inside``: 0.91 at
  ``n = 3``), not 0.95: a reading, not a test;
- ``difference``: ``x_o - x_b`` with Welch's 95% interval (``stats.summary_difference``) when both cells
  are t intervals, the test of "same expected value" at each cell: it excludes 0 in ~5% of cells by
  chance alone (the cells of one report are correlated, so they are not independent tests).

The report's wall-clock and sweep sections are left out: tick times and a parallel Optuna sweep are not
expected to repeat.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from scipy import stats as sps

from commrl.report.render import md_table
from commrl.report.runs import ReportInputError
from commrl.report.stats import CONFIDENCE, Interval, summary_difference
from commrl.report.style import format_interval

SKIPPED_TABLES = ("sweeps",)  # a 2-worker Optuna sweep is not deterministic
CLAIM_COLUMNS = ["pair", "#", "claim", "base", "other", "same verdict"]
CELL_COLUMNS = ["pair", "table", "row", "column", "base", "other", "identical", "inside", "other - base"]


def expected_inside(n: int, confidence: float = CONFIDENCE) -> float:
    """``P(|x_o - x_b| <= h_b)``: the chance that one mean of ``n`` seeds lies in another's t interval when
    both come from one distribution, ``P(|T_{n-1}| <= t_{n-1, (1+c)/2} / sqrt(2))``."""
    quantile = sps.t.ppf((1 + confidence) / 2, n - 1)
    return float(2 * sps.t.cdf(quantile / math.sqrt(2), n - 1) - 1)


@dataclass(frozen=True)
class CellPair:
    """One interval cell of both reports."""

    pair: str
    table: str
    row: str
    column: str
    base: Interval
    other: Interval

    @property
    def identical(self) -> bool:
        b, o = self.base, self.other
        return (b.estimate, b.low, b.high, b.sizes) == (o.estimate, o.low, o.high, o.sizes)

    @property
    def inside(self) -> bool | None:
        """``l_b <= x_o <= h_b``; None when the base has no interval."""
        if self.base.low is None or self.base.high is None:
            return None
        return self.base.low <= self.other.estimate <= self.base.high

    @cached_property
    def difference(self) -> Interval | None:
        """``x_o - x_b`` with Welch's interval; None unless both cells are t intervals."""
        return summary_difference(self.other, self.base)

    @property
    def differs(self) -> bool | None:
        """Whether the difference's interval excludes 0 (None without one)."""
        d = self.difference
        if d is None or d.low is None or d.high is None:
            return None
        return not d.low <= 0.0 <= d.high


@dataclass(frozen=True)
class ClaimPair:
    """One claim of both reports."""

    pair: str
    number: int
    claim: str
    base: dict[str, Any]
    other: dict[str, Any]

    @property
    def rule_changed(self) -> bool:
        """Whether the claim's rule (its text, thresholds and levels) differs: its verdicts then answer two
        questions, and are not compared."""
        return self.base.get("threshold") != self.other.get("threshold")

    @property
    def same_verdict(self) -> bool | None:
        """Whether both reports give the claim one verdict; None when its rule changed between them."""
        return None if self.rule_changed else self.base["status"] == self.other["status"]


@dataclass(frozen=True)
class Comparison:
    """Every shared cell and claim, and what only one report has."""

    base_dir: Path
    other_dir: Path
    cells: list[CellPair]
    claims: list[ClaimPair]
    only_in_one: list[str]
    read_points: dict[str, tuple[Any, Any]]  # pair -> (base's read tick, other's) where they differ

    def summary(self) -> dict[str, Any]:
        tested = [c for c in self.cells if c.differs is not None]
        readable = [c for c in self.cells if c.inside is not None]
        return {
            "cells": len(self.cells),
            "identical": sum(c.identical for c in self.cells),
            "inside_base_interval": sum(bool(c.inside) for c in readable),
            "with_base_interval": len(readable),
            "difference_excludes_zero": sum(bool(c.differs) for c in tested),
            "with_difference_interval": len(tested),
            "claims": len(self.claims),
            "same_verdict": sum(bool(c.same_verdict) for c in self.claims),
            "rule_changed": [f"{c.pair} {c.number}" for c in self.claims if c.rule_changed],
        }

    def summary_lines(self) -> list[str]:
        s = self.summary()
        sizes = sorted(c.base.n for c in self.cells if c.inside is not None)
        expected = (
            f" ({expected_inside(sizes[len(sizes) // 2]):.0%} expected at n = {sizes[len(sizes) // 2]} when "
            "only the noise differs)"
            if sizes
            else ""
        )
        return [
            f"{s['cells']} interval cells in both reports, {s['identical']} identical to the last bit",
            f"other's seed mean inside the base's {CONFIDENCE:.0%} interval: {s['inside_base_interval']} of "
            f"{s['with_base_interval']}{expected}",
            f"Welch {CONFIDENCE:.0%} interval of other - base excludes 0: {s['difference_excludes_zero']} of "
            f"{s['with_difference_interval']} (~5% expected by chance)",
            f"claims with the same verdict: {s['same_verdict']} of {s['claims'] - len(s['rule_changed'])}"
            + (
                f" (not compared, their rule changed: {', '.join(s['rule_changed'])})"
                if s["rule_changed"]
                else ""
            ),
            *[
                f"**{pair} is read at tick {base} in the base and {other} in the other**: its cells measure "
                "different ticks"
                for pair, (base, other) in self.read_points.items()
            ],
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "base": str(self.base_dir),
            "other": str(self.other_dir),
            "summary": self.summary(),
            "only_in_one": self.only_in_one,
            "read_points": {pair: list(ticks) for pair, ticks in self.read_points.items()},
            "claims": [
                {
                    "pair": c.pair,
                    "number": c.number,
                    "claim": c.claim,
                    "base": _claim_fields(c.base),
                    "other": _claim_fields(c.other),
                    "same_verdict": c.same_verdict,
                    "rule_changed": c.rule_changed,
                }
                for c in self.claims
            ],
            "cells": [
                {
                    "pair": c.pair,
                    "table": c.table,
                    "row": c.row,
                    "column": c.column,
                    "base": c.base.as_dict(),
                    "other": c.other.as_dict(),
                    "identical": c.identical,
                    "inside": c.inside,
                    "difference": None if c.difference is None else c.difference.as_dict(),
                    "differs": c.differs,
                }
                for c in self.cells
            ],
        }


def _claim_fields(claim: dict[str, Any]) -> dict[str, Any]:
    return {k: claim.get(k) for k in ("status", "estimate", "low", "high", "n", "reason")}


def _read(directory: Path, name: str) -> dict[str, Any]:
    path = directory / name
    if not path.is_file():
        raise ReportInputError(
            f"{path}: no such file; give a directory that `commrl report` wrote (e.g. results/report, or "
            "the published docs/tiny-report)"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ReportInputError(f"{path}: not JSON ({err}); rewrite it with `commrl report`") from None


def cell_interval(cell: Any) -> Interval | None:
    """A ``tables.json`` interval cell (``{"mean", "low", "high", "n", "method"}``) as an ``Interval``;
    None for any other cell (a name, a count, a missing value, an infinite ratio)."""
    if not isinstance(cell, dict) or not {"mean", "low", "high", "n", "method"} <= set(cell):
        return None
    values = [cell["mean"], cell["low"], cell["high"]]
    numbers = [v for v in values if v is not None]
    if values[0] is None or not all(isinstance(v, int | float) and math.isfinite(v) for v in numbers):
        return None
    return Interval(float(values[0]), cell["low"], cell["high"], (int(cell["n"]),), str(cell["method"]))


def row_label(row: list[Any]) -> str:
    """A row's name: its leading text cells joined by ``/`` (``dense``; ``toy (avg@8)/toy_avg8/acc`` in the
    benchmarks table, where a benchmark has a row per metric)."""
    label = []
    for cell in row:
        if not isinstance(cell, str):
            break
        label.append(cell)
    return "/".join(label) or str(row[0])


def interval_cells(tables: dict[str, Any]) -> dict[tuple[str, str, str, str], Interval]:
    """``(pair, table, row, column) -> interval`` for every interval cell of a ``tables.json``; a key met
    twice raises (two cells would silently become one)."""
    out: dict[tuple[str, str, str, str], Interval] = {}
    for pair, section in tables.get("pairs", {}).items():
        for name, table in section.get("tables", {}).items():
            if name in SKIPPED_TABLES:
                continue
            columns = table["columns"]
            for row in table["rows"]:
                label = row_label(row)
                for column, cell in zip(columns[1:], row[1:], strict=True):
                    interval = cell_interval(cell)
                    if interval is None:
                        continue
                    key = (pair, name, label, column)
                    if key in out:
                        raise ReportInputError(f"tables.json: two cells named {'/'.join(key)}")
                    out[key] = interval
    return out


def _claims(claims: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(pair, int(c["number"])): c for pair, items in claims.get("pairs", {}).items() for c in items}


def compare_reports(base_dir: str | Path, other_dir: str | Path) -> Comparison:
    """Pair the interval cells and claims of two reports (see the module docstring)."""
    base_dir, other_dir = Path(base_dir), Path(other_dir)
    base_tables, other_tables = _read(base_dir, "tables.json"), _read(other_dir, "tables.json")
    base_cells, other_cells = interval_cells(base_tables), interval_cells(other_tables)
    read_points = {
        pair: (section.get("read_at"), other_tables["pairs"][pair].get("read_at"))
        for pair, section in base_tables.get("pairs", {}).items()
        if pair in other_tables.get("pairs", {})
        and section.get("read_at") != other_tables["pairs"][pair].get("read_at")
    }
    base_claims = _claims(_read(base_dir, "claims.json"))
    other_claims = _claims(_read(other_dir, "claims.json"))
    cells = [CellPair(*key, base_cells[key], other_cells[key]) for key in base_cells if key in other_cells]
    claims = [
        ClaimPair(pair, number, claim["claim"], claim, other_claims[pair, number])
        for (pair, number), claim in base_claims.items()
        if (pair, number) in other_claims
    ]
    only = [
        f"{'/'.join(key)}: only in {where}"
        for keys, missing, where in (
            (base_cells, other_cells, base_dir),
            (other_cells, base_cells, other_dir),
        )
        for key in keys
        if key not in missing
    ]
    only += [
        f"{pair} claim {number}: only in {where}"
        for keys, missing, where in (
            (base_claims, other_claims, base_dir),
            (other_claims, base_claims, other_dir),
        )
        for pair, number in keys
        if (pair, number) not in missing
    ]
    return Comparison(base_dir, other_dir, cells, claims, only, read_points)


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else str(value)


def _claim_text(claim: dict[str, Any]) -> str:
    low, high, estimate = claim.get("low"), claim.get("high"), claim.get("estimate")
    if estimate is None:
        return str(claim["status"])
    if low is None or high is None:
        return f"{claim['status']} {_number(estimate)} (n={claim.get('n')})"
    return f"{claim['status']} {_number(estimate)} [{_number(low)}, {_number(high)}] (n={claim.get('n')})"


def _yes_no(value: bool | None) -> str:
    return "" if value is None else ("yes" if value else "**no**")


def _verdicts(claim: ClaimPair) -> str:
    return "rule changed" if claim.rule_changed else _yes_no(claim.same_verdict)


def to_markdown(comparison: Comparison, figure: str | None = None) -> str:
    """The comparison as Markdown: the summary, the claims, then every cell."""
    lines = [
        "# Two reports of the same study",
        "",
        f"- base: `{comparison.base_dir}`",
        f"- other: `{comparison.other_dir}`",
        "",
        *[f"- {line}" for line in comparison.summary_lines()],
        "",
        "A cell is a seed mean with its 95% interval. *inside*: the other run's mean lies in the base's "
        "interval. *other - base*: Welch's 95% interval of the difference of the two means (t cells only); "
        "**excludes 0** marks a cell whose expected value differs. Wall-clock tick times and the Optuna "
        "sweep are left out.",
        "",
    ]
    if figure:
        lines += [f"![other - base, cell by cell]({figure})", ""]
    claims = [
        [c.pair, c.number, c.claim, _claim_text(c.base), _claim_text(c.other), _verdicts(c)]
        for c in comparison.claims
    ]
    lines += ["## Claims", "", md_table(CLAIM_COLUMNS, claims), "", "## Cells", ""]
    cells = []
    for c in comparison.cells:
        d = c.difference
        diff = "" if d is None else format_interval(d) + (" **excludes 0**" if c.differs else "")
        same = "yes" if c.identical else "no"
        cells.append([c.pair, c.table, c.row, c.column, c.base, c.other, same, _yes_no(c.inside), diff])
    lines.append(md_table(CELL_COLUMNS, cells))
    if comparison.only_in_one:
        lines += ["", "## In one report only", "", *[f"- {x}" for x in comparison.only_in_one]]
    return "\n".join(lines) + "\n"


DRAW_LIMIT = 5.0  # half-widths: points beyond are drawn at the edge, as crosses


def draw(comparison: Comparison, path: Path) -> bool:
    """Each t cell's ``x_o - x_b`` in units of its Welch half-width, one row per table: a point beyond ±1
    is a cell whose interval excludes 0 (beyond ±``DRAW_LIMIT``: a cross at the edge). False (nothing
    drawn) without such cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points: dict[str, list[float]] = {}
    pairs = {c.pair for c in comparison.cells}
    for c in comparison.cells:
        d = c.difference
        if d is None or d.half_width is None or d.half_width == 0:
            continue
        name = c.table if len(pairs) == 1 else f"{c.pair}: {c.table}"
        points.setdefault(name, []).append(d.estimate / d.half_width)
    if not points:
        return False
    names = list(points)
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(names) + 1.6))
    for y, name in enumerate(names):
        xs = [max(-DRAW_LIMIT, min(DRAW_LIMIT, x)) for x in points[name]]
        inner = [x for x in xs if abs(x) < DRAW_LIMIT]
        edge = [x for x in xs if abs(x) >= DRAW_LIMIT]
        ax.scatter(inner, [y] * len(inner), s=14, alpha=0.6, color="#1f77b4")
        ax.scatter(edge, [y] * len(edge), s=30, marker="x", color="#d62728")
    for x in (-1, 1):
        ax.axvline(x, color="#d62728", lw=1, ls="--")
    ax.axvline(0, color="#7f7f7f", lw=0.8)
    ax.set_xlim(-DRAW_LIMIT - 0.5, DRAW_LIMIT + 0.5)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel(f"(other - base) / Welch 95% half-width  (|x| > 1: excludes 0; x: beyond ±{DRAW_LIMIT:g})")
    s = comparison.summary()
    ax.set_title(
        f"{s['difference_excludes_zero']} of {s['with_difference_interval']} cells differ (~5% by chance)\n"
        f"{s['same_verdict']} of {s['claims'] - len(s['rule_changed'])} claims keep their verdict",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_comparison(comparison: Comparison, out_dir: str | Path) -> list[Path]:
    """``compare.md``, ``compare.json`` and ``compare.png`` (if there is something to draw) in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figure = out / "compare.png"
    drawn = draw(comparison, figure)
    written = [figure] if drawn else []
    (out / "compare.md").write_text(to_markdown(comparison, figure.name if drawn else None))
    (out / "compare.json").write_text(json.dumps(comparison.as_dict(), indent=2, allow_nan=False) + "\n")
    return [out / "compare.md", out / "compare.json", *written]
