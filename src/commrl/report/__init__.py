"""The report: the note's figures and tables, and its claims checked, from the runs tracked in MLflow.

``build_report(pairs, out_dir, tracking_uri=None)`` is the entry point (``commrl report`` calls it).
Modules: ``runs`` (read MLflow), ``curves`` (seeds combined, per-seed read-outs), ``stats`` (intervals
over seeds, verdicts), ``tables``, ``claims``, ``figures``, ``render`` (Markdown, HTML), ``style`` (colours,
names, number formats), ``build`` (orchestration, atomic write).
"""

from commrl.report.build import ReportResult, build_report
from commrl.report.claims import Claim, ClaimThresholds, evaluate_claims
from commrl.report.runs import ReportInputError
from commrl.report.stats import Interval, difference_interval, mean_interval, ratio_interval, verdict

__all__ = [
    "Claim",
    "ClaimThresholds",
    "Interval",
    "ReportInputError",
    "ReportResult",
    "build_report",
    "difference_interval",
    "evaluate_claims",
    "mean_interval",
    "ratio_interval",
    "verdict",
]
