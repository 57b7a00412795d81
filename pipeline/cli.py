"""The `decision` command line: one subcommand per stage, each with `--help` and a `--json` mode.

    decision validate data/processed/vader.jsonl --slice 0:1000
    decision validate big.parquet --slice 1000000:1001000 --json

Heavy libraries are imported inside the subcommands so that `decision --help` answers at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_OK, EXIT_UNREADABLE, EXIT_NOTHING_USABLE = 0, 1, 2


def _validate(args: argparse.Namespace) -> int:
    from pipeline.read import BadSlice, RowSlice, UnreadableInput
    from pipeline.validate import validate_file

    try:
        data = validate_file(args.data, RowSlice.parse(args.slice), with_records=False)
    except (UnreadableInput, BadSlice) as error:
        print(f"decision validate: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    report = data.report.to_dict()
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)
    if data.report.kept == 0:
        print(
            f"decision validate: no usable decision in {args.data} ({data.report.decisions} decisions, "
            "all skipped; see the reasons above)",
            file=sys.stderr,
        )
        return EXIT_NOTHING_USABLE
    return EXIT_OK


def print_report(report: dict[str, Any]) -> None:
    """The validation report as readable tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    span = "all" if report["rows"] == report["file_rows"] else f"rows {report['slice']} of"
    totals = Table(title=f"Validation of {report['source']} ({span} {report['file_rows']:,} rows)")
    for name in ("rows", "decisions", "kept", "skipped"):
        totals.add_column(name, justify="right")
    totals.add_row(*(f"{report[k]:,}" for k in ("rows", "decisions", "kept", "skipped_total")))
    console.print(totals)
    if not report["skipped"]:
        console.print("No decision skipped.")
        return
    reasons = Table(title="Skipped decisions by reason (first example of each)")
    for name, justify in (("reason", "left"), ("count", "right"), ("row", "right"), ("question", "left"),
                          ("value", "left")):  # fmt: skip
        reasons.add_column(name, justify=justify, overflow="fold")
    for reason, count in report["skipped"].items():
        example = report["examples"][reason]
        reasons.add_row(reason, f"{count:,}", str(example["row"]), str(example["question_id"] or "-"),
                        example["value"][:80])  # fmt: skip
    console.print(reasons)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="decision",
        description="Fine-tune, calibrate, export, serve and promote decision models.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    validate = commands.add_parser(
        "validate",
        help="validate a decision file and report skipped decisions by reason",
        description="Validate decision rows (JSONL, Parquet or CSV). Bad rows never stop the run: each unusable "
        "decision is skipped and counted by reason. Exit 0 when at least one decision is usable, 2 when none "
        "is, 1 when the file cannot be read.",
    )
    validate.add_argument("data", help="decision file: .jsonl, .parquet or .csv")
    validate.add_argument(
        "--slice", metavar="START:END", help="validate rows [START, END) only; taken before rows are parsed"
    )
    validate.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    validate.set_defaults(handler=_validate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
