"""The report: the note's figures and tables, and its claims checked, from the runs tracked in MLflow.

``build_report(pairs, out_dir, tracking_uri=None)`` is the entry point (``commrl report`` calls it).
Modules: ``runs`` (read MLflow), ``curves`` (seeds combined, read-outs), ``tables``, ``claims``,
``figures``, ``render`` (Markdown, HTML), ``style`` (colours, names), ``build`` (orchestration, atomic write).
"""

from commrl.report.build import ReportResult, build_report
from commrl.report.claims import Claim, ClaimThresholds, evaluate_claims
from commrl.report.runs import ReportInputError

__all__ = ["Claim", "ClaimThresholds", "ReportInputError", "ReportResult", "build_report", "evaluate_claims"]
