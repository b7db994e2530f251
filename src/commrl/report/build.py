"""``build_report``: read the pairs from MLflow, draw, tabulate, check the claims, write, log as a run.

Outputs in ``out_dir``: the figures (``figNN_<what>_<pair>.png``), ``report.md``, ``report.html``,
``tables.json``, ``claims.json`` and ``captions.json`` (figure file -> caption, for Snakemake's
``report()``). With ``network`` (``commrl.report.network.NetworkOptions``) the report adds the network
model's section, "from bytes to seconds" (its figures, ``tables.json``'s ``network``). Everything is
written in a temporary sibling directory, logged as the artifacts of a run ``kind=report`` in experiment
``commrl/report``, and only then swapped in place of ``out_dir``: a failed report leaves the previous one
(or nothing) behind, never a half-written one.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from commrl import tracking
from commrl.report.claims import STATUSES, Claim, ClaimThresholds, evaluate_claims
from commrl.report.figures import FIGURES, FigureResult
from commrl.report.render import PairSection, to_html, to_markdown
from commrl.report.runs import REPORT_EXPERIMENT, PairRuns, ReportInputError, list_pairs, load_pair
from commrl.report.style import condition_colours, order_conditions
from commrl.report.tables import Table, pair_tables
from commrl.staging import staged_dir

if TYPE_CHECKING:
    from commrl.report.network import NetworkOptions, NetworkSection
    from commrl.report.selection import RunSelection

TITLE = "commrl report: the note's figures and tables from tracked runs"
REPORT_FILES = ("report.md", "report.html", "tables.json", "claims.json", "captions.json")


@dataclass
class ReportResult:
    out_dir: Path
    pairs: list[str]
    run_id: str
    figures: list[FigureResult]
    tables: dict[str, list[Table]]
    claims: dict[str, list[Claim]]
    notes: list[str] = field(default_factory=list)
    network: list[NetworkSection] = field(default_factory=list)

    @property
    def files(self) -> list[Path]:
        figures = [self.out_dir / f.file for f in self.figures if f.drawn]
        return [self.out_dir / f for f in REPORT_FILES] + figures


def build_report(
    pairs: Sequence[str],
    out_dir: str | Path,
    tracking_uri: str | None = None,
    thresholds: ClaimThresholds | None = None,
    network: NetworkOptions | None = None,
    only: RunSelection | None = None,
) -> ReportResult:
    """The report of ``pairs`` (every ``commrl/<pair>`` experiment when empty) written to ``out_dir``;
    with ``network``, also the network model's section; with ``only``, of the runs it names alone."""
    uri = tracking_uri or tracking.default_tracking_uri()
    out = Path(out_dir).resolve()
    _check_out_dir(out)
    pairs = list(pairs) or list_pairs(uri)
    if not pairs:
        raise ReportInputError(
            f"no commrl/<pair> experiments in the MLflow store {uri}; train a pair first, or pass "
            "--tracking-uri"
        )
    loaded = [load_pair(p, uri, only) for p in tqdm(pairs, desc="reading pairs", unit="pair")]
    if only is not None:
        only.check_found(
            (r.run_id for p in loaded for r in p.train),
            (e.run_id for p in loaded for e in p.evals),
            (name for p in loaded for s in p.sweeps for name in (s.run_id, s.study) if name),
        )
    thresholds = thresholds or ClaimThresholds()
    client = tracking.client(uri)
    run = client.create_run(
        tracking.ensure_experiment(REPORT_EXPERIMENT, uri, client),
        run_name=f"report/{'+'.join(pairs)}",
        tags={"kind": "report", "pairs": ",".join(pairs), "git_commit": tracking.git_commit()},
    )
    try:
        with staged_dir(out) as stage:
            result = _write(loaded, stage, uri, run.info.run_id, thresholds, network)
            client.log_artifacts(run.info.run_id, str(stage))
            _log_claim_counts(client, run.info.run_id, result.claims)
    except BaseException:
        client.set_terminated(run.info.run_id, "FAILED")
        raise
    client.set_terminated(run.info.run_id, "FINISHED")
    result.out_dir = out
    return result


def _check_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "report.md").exists())):
        raise ReportInputError(
            f"--out {out} exists and is not a commrl report (no report.md in it); the report replaces "
            "its out dir as a whole, so choose a new or empty directory"
        )


def _write(
    loaded: list[PairRuns],
    tmp: Path,
    uri: str,
    run_id: str,
    thresholds: ClaimThresholds,
    network: NetworkOptions | None = None,
) -> ReportResult:
    colours = condition_colours({c for runs in loaded for c in runs.conditions()})
    sections, notes = [], []
    jobs = [(runs, draw) for runs in loaded for draw in FIGURES]
    drawn: dict[str, list[FigureResult]] = {runs.pair: [] for runs in loaded}
    for runs, draw in tqdm(jobs, desc="figures", unit="fig"):
        drawn[runs.pair].append(draw(runs, colours, tmp))
    for runs in loaded:
        figures = sorted(drawn[runs.pair], key=lambda f: f.number)
        tables = pair_tables(runs)
        notes += runs.notes + [n for f in figures for n in f.notes] + [t.note for t in tables if t.note]
        seeds = Counter(r.condition for r in runs.train)
        sections.append(
            PairSection(
                runs.pair,
                runs.read_at(),
                {c: seeds[c] for c in order_conditions(seeds)},
                evaluate_claims(runs, thresholds),
                tables,
                figures,
            )
        )
    network_sections: list[NetworkSection] = []
    if network is not None:
        from commrl.report.network import network_sections as draw_network

        network_sections, network_notes = draw_network(loaded, network, uri, tmp, colours)
        notes += network_notes
    header = [
        f"generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} from {uri}",
        f"pairs: {', '.join(r.pair for r in loaded)}; MLflow run {run_id} in experiment {REPORT_EXPERIMENT}",
        f"commit {tracking.git_commit()}",
    ]
    (tmp / "report.md").write_text(to_markdown(TITLE, header, notes, sections, network_sections))
    (tmp / "report.html").write_text(to_html(TITLE, header, notes, sections, tmp, network_sections))
    _dump(
        tmp / "tables.json",
        {
            "tracking_uri": uri,
            "run_id": run_id,
            "notes": notes,
            "pairs": {
                s.pair: {
                    "read_at": s.read_at,
                    "seeds": s.seeds,
                    "tables": {t.key: t.as_dict() for t in s.tables},
                }
                for s in sections
            },
            **({"network": {n.key: n.as_dict() for n in network_sections}} if network is not None else {}),
        },
    )
    _dump(
        tmp / "claims.json",
        {
            "thresholds": asdict(thresholds),
            "pairs": {s.pair: [c.as_dict() for c in s.claims] for s in sections},
        },
    )
    all_figures = [f for s in sections for f in s.figures] + [f for n in network_sections for f in n.figures]
    captions = {f.file: f"{f.title} (pair {f.pair}). {f.caption}" for f in all_figures if f.drawn}
    _dump(tmp / "captions.json", captions)
    return ReportResult(
        out_dir=tmp,
        pairs=[s.pair for s in sections],
        run_id=run_id,
        figures=all_figures,
        tables={s.pair: s.tables for s in sections},
        claims={s.pair: s.claims for s in sections},
        notes=notes,
        network=network_sections,
    )


def _jsonable(value: Any) -> Any:
    """NaN -> null, +-inf -> "inf"/"-inf", recursively: ``tables.json`` stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(_jsonable(data), indent=2, allow_nan=False) + "\n")


def _log_claim_counts(client, run_id: str, claims: dict[str, list[Claim]]) -> None:
    from mlflow.entities import Metric

    metrics = [
        Metric(f"claims/{pair}/{status.replace('/', '')}", float(sum(c.status == status for c in cs)), 0, 0)
        for pair, cs in claims.items()
        for status in STATUSES
    ]
    client.log_batch(run_id, metrics=metrics)
