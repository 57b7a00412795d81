"""`decision validate`: decision rows (or a plain table through a mapping) checked; bad rows never stop the
run, each unusable decision is skipped and counted by reason.

decision validate data/processed/vader.jsonl --slice 0:1000
decision validate big.parquet --slice 1000000:1001000 --json
"""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.cli.mapping_flags import BadMappingFlags, add_mapping_arguments, loaded_mapping, mapping_value
from pipeline.cli.options import DATA_HELP, add_output_flags
from pipeline.cli.runner import EXIT_OK, refuse, run_command
from pipeline.cli.tables import console, progress_outputs

DESCRIPTION = (
    "Validate decision rows (JSONL, Parquet or CSV). Bad rows never stop the run: each unusable decision is "
    "skipped and counted by reason. Exit 0 when at least one decision is usable, 2 when none is or DATA or "
    "the slice is the user's mistake (no such path, an unknown format, a plain table without a mapping, a "
    "slice past the end), 1 when the file cannot be read (corrupt, an I/O error)."
)


def add_validate(commands) -> None:
    """`decision validate` on the `decision` subparsers."""
    validate = commands.add_parser(
        "validate",
        help="validate a decision file and report skipped decisions by reason",
        description=DESCRIPTION,
    )
    validate.add_argument("data", help=DATA_HELP)
    validate.add_argument(
        "--slice", metavar="START:END", help="validate rows [START, END) only; taken before rows are parsed"
    )
    add_output_flags(validate)
    add_mapping_arguments(validate)
    validate.set_defaults(handler=handle_validate)


def handle_validate(args: argparse.Namespace) -> int:
    from pipeline.data.read import RowSlice, UnreadableInput
    from pipeline.data.validate import validate_file

    def validated():
        mapping = loaded_mapping(mapping_value(args))
        report = progress_outputs(args)[1]
        return validate_file(
            args.data, RowSlice.parse(args.slice), with_records=False, mapping=mapping, report=report
        )

    return run_command(
        args,
        validated,
        lambda data: print_report(data.report.to_dict()),
        refused=(UnreadableInput,),
        refused_input=(BadMappingFlags,),
        as_json=lambda data: data.report.to_dict(),
        done=lambda data: _usable(args, data.report),
    )


def _usable(args: argparse.Namespace, report) -> int:
    """Exit 2 where no decision is usable: a report of skips only is no result."""
    if report.kept == 0:
        return refuse(
            args,
            f"no usable decision in {args.data} ({report.decisions} decisions, all skipped; see the reasons "
            "above)",
        )
    return EXIT_OK


def print_report(report: dict[str, Any]) -> None:
    """The validation report as readable tables."""
    from rich.table import Table

    out = console()
    span = "all" if report["rows"] == report["file_rows"] else f"rows {report['slice']} of"
    totals = Table(title=f"Validation of {report['source']} ({span} {report['file_rows']:,} rows)")
    for name in ("rows", "decisions", "kept", "skipped"):
        totals.add_column(name, justify="right")
    totals.add_row(*(f"{report[k]:,}" for k in ("rows", "decisions", "kept", "skipped_total")))
    out.print(totals)
    _print_sizes(out, report)
    if not report["skipped"]:
        out.print("No decision skipped.")
        return
    reasons = Table(title="Skipped decisions by reason (first example of each)")
    columns = (
        ("reason", "left"),
        ("count", "right"),
        ("row", "right"),
        ("question", "left"),
        ("value", "left"),
    )
    for name, justify in columns:
        reasons.add_column(name, justify=justify, overflow="fold")
    for reason, count in report["skipped"].items():
        example = report["examples"][reason]
        question = str(example["question_id"] or "-")
        reasons.add_row(reason, f"{count:,}", str(example["row"]), question, example["value"][:80])
    out.print(reasons)


def _print_sizes(out, report: dict[str, Any]) -> None:
    """How long the states are, how rows group into records, a mapped table's labels (as `decision map`)."""
    from pipeline.data.contract import GroupSizes, StateSizes

    if "states" in report:
        out.print(StateSizes(**report["states"]).describe(), highlight=False)
    if "groups" in report:
        rows = report.get("states", {}).get("rows", report["rows"])
        out.print(GroupSizes(**report["groups"]).describe(rows), highlight=False)
    for question, counts in report.get("labels", {}).items():
        shown = ", ".join(f"{label} {count:,}" for label, count in counts.items())
        out.print(f"labels of {question}: {shown}", highlight=False)
