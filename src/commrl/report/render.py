"""``report.md`` (figures by relative path) and a self-contained ``report.html`` (figures inlined, base64).

Both open with how to read the numbers (``reading_guide``: the interval method and the verdict rule, once)
and state the seeds per condition of every pair; the network model's sections (``commrl.report.network``),
when there are any, follow the pairs.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from commrl.report.claims import STATUSES, Claim
from commrl.report.figures import FigureResult
from commrl.report.stats import BOOTSTRAP_SEED, CONFIDENCE, MIN_BOOTSTRAP_N, N_RESAMPLES, Interval
from commrl.report.style import format_interval, format_number
from commrl.report.tables import Cell, Table

if TYPE_CHECKING:
    from commrl.report.network import NetworkSection

CLAIM_COLUMNS = ["#", "claim", "the note", "threshold", "this run (seed means, 95% CI)", "status", "why"]
CSS = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.PASS { background: #dff3df; font-weight: bold; } td.MISS { background: #f8dcdc; font-weight: bold; }
td.INCONCLUSIVE { background: #fff2cc; font-weight: bold; }
td.na { color: #777; }
figure { margin: 1em 0 2em; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #444; }
.note { background: #fff6d6; border-left: 4px solid #e0b400; padding: 0.3em 0.8em; margin: 0.3em 0; }
"""


@dataclass
class PairSection:
    pair: str
    read_at: int | None
    seeds: dict[str, int]
    claims: list[Claim]
    tables: list[Table]
    figures: list[FigureResult]


def reading_guide() -> list[str]:
    """How to read the report, one paragraph per item: the cells, the interval method, the verdict rule."""
    level = f"{CONFIDENCE:.0%}"
    return [
        "Every value from training or evaluation runs is read per seed (each seed's own curve), then "
        "combined over the seeds of its condition: a cell reads `mean ± half-width (n=k)`, the half-width "
        f"of a {level} confidence interval of the seed mean (an asymmetric interval reads `mean [low, high] "
        "(n=k)`); `value (n=1)` is one seed, with no interval. Curves show the seed mean per tick with its "
        f"{level} interval as a band; bars show it as a whisker.",
        f"Intervals: below {MIN_BOOTSTRAP_N} seeds, Student's t (`mean ± t(n-1) s / sqrt(n)`; for two "
        "conditions run on the same seeds, the interval of the per-seed differences, paired by seed; on "
        "different seeds, Welch's interval; for a ratio of means, Fieller's interval, cut at 0 where both "
        "quantities are never negative (KL, bytes, times: the cut keeps its coverage)); from "
        f"{MIN_BOOTSTRAP_N} seeds, the BCa bootstrap (scipy.stats.bootstrap, {N_RESAMPLES} resamples, fixed "
        f"seed {BOOTSTRAP_SEED}, so a rebuild gives the same interval). Seeds that agree exactly give the "
        "point interval.",
        f"Verdicts: a claim is PASS when its {level} interval lies entirely on the claim's side of the "
        "threshold, MISS when it lies entirely on the other side, INCONCLUSIVE when it straddles the "
        "threshold or when there is no interval (one seed: 'n=1: no interval'); n/a when its runs or metrics "
        "are missing. A claim of two checks passes when both pass and misses when either misses, each at "
        f"{level} (so a false MISS of such a claim is at most twice a one-check claim's, 2 x 2.5%; its "
        "false PASS stays at a one-check claim's, as both must pass); a claim "
        "over alternatives (any of m rollout corrections) passes when any passes and misses when all "
        "miss, each of its intervals at 1 - (1 - level)/m (Bonferroni), and its 'why' opens with the passing "
        "checks ('passing: none' if none). The column 'why' "
        "gives the deciding interval against the threshold.",
    ]


def format_cell(value: Cell) -> str:
    """``None`` -> ``n/a``; an interval as ``mean ± half-width (n=k)``; large integral floats (bytes) with
    thousands separators; other floats 4 digits."""
    if value is None:
        return "n/a"
    if isinstance(value, Interval):
        return format_interval(value)
    if isinstance(value, float):
        return format_number(value)
    return str(value)


def _claim_rows(claims: list[Claim]) -> list[list[Cell]]:
    return [[c.number, c.claim, c.note, c.threshold, c.value, c.status, c.reason] for c in claims]


def _summary(section: PairSection) -> str:
    counts = {s: sum(c.status == s for c in section.claims) for s in STATUSES}
    seeds = ", ".join(f"{c} n={n}" for c, n in section.seeds.items()) or "none"
    read = "the last tick (no read_at tag)" if section.read_at is None else f"tick {section.read_at}"
    claims = ", ".join(f"{n} {s}" for s, n in counts.items())
    return f"Read at {read}. Seeds per condition (training runs): {seeds}. Claims: {claims}."


def md_table(columns: list[str], rows: list[list[Cell]]) -> str:
    def cell(v: Cell) -> str:
        return format_cell(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _md_tables(tables: list[Table]) -> list[str]:
    out = []
    for t in tables:
        out += [f"#### {t.title}", ""]
        out += [f"> {t.note}", ""] if t.note else [md_table(t.columns, t.rows), ""]
    return out


def _md_figures(figures: list[FigureResult]) -> list[str]:
    out = []
    for f in figures:
        if f.drawn:
            image = f"![{f.title} (pair {f.pair})]({f.file})"
            out += [f"#### Figure {f.number}: {f.title}", "", image, "", f"*{f.caption}*", ""]
        out += [f"> {n}" for n in f.notes] + ([""] if f.notes else [])
    return out


def _md_network(network: Sequence[NetworkSection]) -> list[str]:
    from commrl.report.network import MODEL_GUIDE

    out = ["## From bytes to seconds: the network model", "", MODEL_GUIDE, ""]
    for n in network:
        out += [f"### Pair {n.title}", "", n.summary, "", *(f"> {note}" for note in n.notes)]
        out += [""] if n.notes else []
        out += _md_tables(n.tables) + _md_figures(n.figures)
    return out


def to_markdown(
    title: str,
    header: list[str],
    notes: list[str],
    sections: list[PairSection],
    network: Sequence[NetworkSection] = (),
) -> str:
    out = [f"# {title}", "", *(f"- {h}" for h in header), ""]
    out += ["## How to read the numbers", "", *(p for para in reading_guide() for p in (para, ""))]
    if notes:
        out += ["## Notes", "", *(f"- {n}" for n in notes), ""]
    for s in sections:
        out += [
            f"## Pair {s.pair}",
            "",
            _summary(s),
            "",
            "### Claims: the note against this run",
            "",
            md_table(CLAIM_COLUMNS, _claim_rows(s.claims)),
            "",
            "### Tables",
            "",
        ]
        out += _md_tables(s.tables)
        out += ["### Figures", ""]
        out += _md_figures(s.figures)
    if network:
        out += _md_network(network)
    return "\n".join(out).rstrip() + "\n"


def _html_table(columns: list[str], rows: list[list[Cell]], status_column: int | None = None) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            text = format_cell(v)
            cls = ("na" if text == "n/a" else text) if i == status_column or text == "n/a" else ""
            attr = f' class="{cls}"' if cls else ""
            cells.append(f"<td{attr}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _img(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _html_tables(tables: list[Table]) -> list[str]:
    out = []
    for t in tables:
        out.append(f"<h4>{html.escape(t.title)}</h4>")
        out.append(f'<p class="note">{html.escape(t.note)}</p>' if t.note else _html_table(t.columns, t.rows))
    return out


def _html_figures(figures: list[FigureResult], figure_dir: Path) -> list[str]:
    e = html.escape
    out = []
    for f in figures:
        if f.drawn:
            out.append(
                f"<figure><h4>Figure {f.number}: {e(f.title)}</h4>"
                f"<img src='{_img(figure_dir / f.file)}' alt='{e(f.title)} (pair {e(f.pair)})'>"
                f"<figcaption>{e(f.caption)}</figcaption></figure>"
            )
        out += [f'<p class="note">{e(n)}</p>' for n in f.notes]
    return out


def _html_network(network: Sequence[NetworkSection], figure_dir: Path) -> list[str]:
    from commrl.report.network import MODEL_GUIDE

    e = html.escape
    out = [f"<h2>From bytes to seconds: the network model</h2><p>{e(MODEL_GUIDE)}</p>"]
    for n in network:
        out.append(f"<h3>Pair {e(n.title)}</h3><p>{e(n.summary)}</p>")
        out += [f'<p class="note">{e(note)}</p>' for note in n.notes]
        out += _html_tables(n.tables) + _html_figures(n.figures, figure_dir)
    return out


def to_html(
    title: str,
    header: list[str],
    notes: list[str],
    sections: list[PairSection],
    figure_dir: Path,
    network: Sequence[NetworkSection] = (),
) -> str:
    """The same document as ``to_markdown``, with every figure read from ``figure_dir`` and inlined."""
    e = html.escape
    out = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{CSS}</style>"
        f"</head><body><h1>{e(title)}</h1><ul>{''.join(f'<li>{e(h)}</li>' for h in header)}</ul>",
        "<h2>How to read the numbers</h2>" + "".join(f"<p>{e(para)}</p>" for para in reading_guide()),
    ]
    if notes:
        out.append("<h2>Notes</h2>" + "".join(f'<p class="note">{e(n)}</p>' for n in notes))
    for s in sections:
        out.append(f"<h2>Pair {e(s.pair)}</h2><p>{e(_summary(s))}</p>")
        out.append("<h3>Claims: the note against this run</h3>")
        out.append(
            _html_table(CLAIM_COLUMNS, _claim_rows(s.claims), status_column=CLAIM_COLUMNS.index("status"))
        )
        out.append("<h3>Tables</h3>")
        out += _html_tables(s.tables)
        out.append("<h3>Figures</h3>")
        out += _html_figures(s.figures, figure_dir)
    if network:
        out += _html_network(network, figure_dir)
    out.append("</body></html>")
    return "\n".join(out) + "\n"
