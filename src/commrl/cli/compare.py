"""``commrl compare BASE OTHER``: another run of a study against a report of it (e.g. your ``make pipeline``
against the README's ``docs/tiny-report``), cell by cell and claim by claim."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", help="a report directory (tables.json, claims.json), e.g. docs/tiny-report")
    parser.add_argument("other", help="the report to check against it, e.g. results/report")
    parser.add_argument(
        "--out", default="results/compare", help="where compare.md, compare.json and compare.png go"
    )


def run(args: argparse.Namespace) -> int:
    from commrl.cli.main import fail
    from commrl.report.compare import compare_reports, write_comparison
    from commrl.report.runs import ReportInputError

    try:
        comparison = compare_reports(args.base, args.other)
    except ReportInputError as err:
        return fail("compare", err)
    written = write_comparison(comparison, args.out)
    print(f"{args.other} against {args.base}:")
    for line in comparison.summary_lines():
        print(f"  {line}")
    for claim in comparison.claims:
        if not claim.same_verdict:
            changed = f"{claim.base['status']} -> {claim.other['status']}"
            rule = f" (rule changed: {claim.base.get('threshold')} -> {claim.other.get('threshold')})"
            print(f"  claim {claim.number} ({claim.claim}): {changed}{rule if claim.rule_changed else ''}")
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0
