"""`decision map`, and the mapping flags `validate`, `train` and `finetune` share: a plain table (a text column
and a label column, say) read as decision rows (docs/data-format.md, "Mapping a table").

    decision map --data tickets.csv --state-column text --label-column label --preview 3
    decision map --data tickets.parquet --mapping tickets.mapping.yaml --write tickets.jsonl
    decision validate tickets.csv --state-column text --label-column label
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import orjson

from pipeline.cli.tables import number_option

EXIT_OK, EXIT_UNREADABLE, EXIT_BAD_INPUT = 0, 1, 2
_QUESTION_FLAGS = ("question", "type", "instructions", "options")


class BadMappingFlags(ValueError):
    """Mapping flags that do not make a mapping (the message names the flag)."""


def add_mapping_arguments(command: argparse.ArgumentParser) -> None:
    """`--mapping FILE`, or the flags of the common case, on a command that reads a table."""
    group = command.add_argument_group(
        'mapping a plain table (docs/data-format.md, "Mapping a table"): --mapping FILE, or --state-column '
        "with --label-column"
    )
    group.add_argument("--mapping", metavar="FILE", help="a mapping YAML file: state column(s), and per question "
                       "its label column, type, instructions and options (default: validate.mapping in "
                       "params.yaml where the command reads it; else DATA holds decision rows)")  # fmt: skip
    group.add_argument("--state-column", nargs="+", metavar="COL",
                       help="the state's column; several make a JSON-object state {COL: value}")  # fmt: skip
    group.add_argument("--label-column", metavar="COL", help="the column holding the question's gold labels")
    group.add_argument(
        "--question", metavar="ID", help="the question's id (default: the label column's name)"
    )
    group.add_argument("--type", choices=("choice", "score", "noul"),
                       help="choice (default), score (ordered levels) or noul (yes/no: true/false, yes/no, 1/0)")  # fmt: skip
    group.add_argument("--instructions", metavar="TEXT", help="what the question asks")
    group.add_argument("--options", nargs="+", metavar="LABEL",
                       help="the labels allowed, in order (a score's levels low to high; default: the labels "
                       "found); a label outside them is refused")  # fmt: skip


def mapping_value(args: argparse.Namespace) -> str | dict[str, Any] | None:
    """What the flags say `validate.mapping` is: the --mapping path, the mapping the flags stand for, or None."""
    from pipeline.data.mapping import flags_mapping

    question_flags = [f"--{name}" for name in _QUESTION_FLAGS if getattr(args, name) is not None]
    if args.mapping is not None:
        given = [
            f for f in ("--state-column", "--label-column", *question_flags) if _flag(args, f) is not None
        ]
        if given:
            raise BadMappingFlags(
                f"--mapping FILE says it all: drop {', '.join(given)} (or put them in the file)"
            )
        return args.mapping
    if args.state_column is None and args.label_column is None:
        if question_flags:
            raise BadMappingFlags(f"{', '.join(question_flags)} need --state-column and --label-column")
        return None
    if args.state_column is None or args.label_column is None:
        missing = "--state-column COL" if args.state_column is None else "--label-column COL"
        raise BadMappingFlags(f"a mapping by flags needs {missing} too (or give --mapping FILE)")
    return flags_mapping(args.state_column, args.label_column, args.question, args.type or "choice",
                         args.instructions, args.options)  # fmt: skip


ROWS = number_option(int, lambda n: n >= 0, "a whole number of rows, 0 or more, e.g. 5")


def _flag(args: argparse.Namespace, flag: str) -> Any:
    return getattr(args, flag.removeprefix("--").replace("-", "_"))


def _map(args: argparse.Namespace) -> int:
    from pipeline.config import ConfigError
    from pipeline.data.mapping import MappingError, load_mapping, read_mapped, write_rows
    from pipeline.data.read import BadSlice, BadSource, RowSlice, UnreadableInput
    from pipeline.data.validate import validate_columns

    try:
        value = _run_mapping(args)
        if value is None:
            raise BadMappingFlags(
                "say how to map DATA: --mapping FILE, or --state-column COL --label-column COL"
            )
        mapping, row_slice = load_mapping(value), RowSlice.parse(args.slice)
        if args.write and (problem := _write_problem(Path(args.write), args.data)):
            raise BadMappingFlags(problem)
        mapped, total = read_mapped(args.data, mapping, row_slice)
        report = validate_columns(mapped.columns, row_slice.start, with_records=False).report.to_dict()
        # Nothing is written from rows with no usable decision.
        replaced = bool(args.write) and Path(args.write).exists()
        written = write_rows(mapped, args.write) if args.write and report["kept"] else None
    except (BadMappingFlags, MappingError, ConfigError) as error:
        print(f"decision map: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (UnreadableInput, BadSlice) as error:
        print(f"decision map: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT if isinstance(error, BadSource | BadSlice) else EXIT_UNREADABLE
    result = _result(args, mapping, mapped, total, report, written) | {"replaced": bool(written) and replaced}
    print(json.dumps(result, default=str) if args.json else _text(result))
    if report["kept"] == 0:
        print(f"decision map: no usable decision in {args.data} ({report['decisions']} decisions, all skipped: "
              f"{_reasons(report['skipped'])}); nothing written", file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    return EXIT_OK


def _write_problem(out: Path, data: str) -> str | None:
    """Why mapped rows must not go to `out`: it is the table being mapped, lies in the folder of its shards, is a
    folder, or lies where no file can be made."""
    from pipeline.data.sources import written_into
    from pipeline.families.base_folders import unwritable_place

    clash = written_into(out, data)
    if clash:
        return f"--write {out}: {clash}; write the rows elsewhere"
    if out.is_dir():
        return f"--write {out}: a folder; give the file to write (.jsonl or .parquet)"
    unwritable = unwritable_place(out)
    return f"--write {out}: {unwritable}" if unwritable else None


def _result(args: argparse.Namespace, mapping, mapped, total: int, report: dict, written) -> dict[str, Any]:
    """What `decision map` prints: per question its column, type and option counts; validation; the preview."""
    from pipeline.data.mapping import decision_rows, option_counts

    counts = option_counts(mapped)
    questions = {
        qid: {"column": q.column, "type": q.type, "instructions": q.instructions,
              "options_given": mapping.questions[qid].options is not None, "options": counts[qid]}
        for qid, q in mapped.mapping.questions.items()
    }  # fmt: skip
    return {
        "source": args.data, "slice": args.slice or "0:", "file_rows": total, "rows": len(mapped.columns),
        "questions": questions, "validation": {k: report[k] for k in _SUMMARY},
        "preview": decision_rows(mapped, args.preview), "written": str(written) if written else None,
    }  # fmt: skip


_SUMMARY = ("decisions", "kept", "skipped_total", "skipped", "examples")


def _text(result: dict[str, Any]) -> str:
    sliced = "" if result["slice"] == "0:" else f" (rows {result['slice']} of {result['file_rows']:,})"
    lines = [f"{result['source']}: {result['rows']:,} rows{sliced}"]
    for qid, question in result["questions"].items():
        origin = "given" if question["options_given"] else "from the labels"
        origin = "false/true" if question["type"] == "noul" else origin
        lines.append(f"question {qid} ({question['type']}, labels in column {question['column']}): options "
                     f"{origin}, with their counts")  # fmt: skip
        width = max(len(option) for option in question["options"])
        lines += [f"  {option:{width}s}  {count:,}" for option, count in question["options"].items()]
    summary = result["validation"]
    skipped = f": {_reasons(summary['skipped'])}" if summary["skipped"] else ""
    lines.append(f"{summary['kept']:,} of {summary['decisions']:,} decisions usable{skipped}")
    lines.append(f"the first {len(result['preview'])} rows as they will be trained:")
    lines += [json.dumps(row, default=_as_trained) for row in result["preview"]]
    if result["written"]:
        replaced = " (replacing the file that was there)" if result.get("replaced") else ""
        lines.append(f"wrote {result['rows']:,} decision rows to {result['written']}{replaced}")
    return "\n".join(lines)


def _reasons(skipped: dict[str, int]) -> str:
    return ", ".join(f"{reason} {count:,}" for reason, count in skipped.items())


def add_data_commands(commands) -> None:
    """Register `map` on the `decision` subparsers."""
    command = commands.add_parser(
        "map",
        help="read a plain table as decision rows: options per question with counts, and a preview",
        description="Map DATA (a plain table: JSONL, Parquet or CSV) to decision rows with --mapping FILE or the "
        "flags, and print each question's options with their counts in the rows, how many decisions are usable "
        "(and why the rest are not), and the first rows as they will be trained; --write saves the mapped rows "
        "as a decision file. Exit 2 for a mapping that names a column DATA lacks, a label outside the given "
        "options, a DATA or slice that is the user's mistake, or rows with no usable decision; 1 when DATA "
        "cannot be read (corrupt, an I/O error).",
    )
    command.add_argument("--data", help="the table: a file, folder or glob of shards, as training reads them (default: "
                         "--run-config's retrain.data)")  # fmt: skip
    command.add_argument("--run-config", metavar="NAME",
                         help="configs/NAME.yaml (as decision init writes it): its validate.mapping where neither "
                              "--mapping nor the flags are given, and its retrain.data where --data is not")  # fmt: skip
    command.add_argument("--preview", type=ROWS, default=5, metavar="N", help="rows to print (default: 5)")
    command.add_argument("--write", metavar="OUT", help="write the mapped rows to OUT (.jsonl or .parquet)")
    command.add_argument("--slice", metavar="START:END", help="map rows [START, END) only")
    command.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    add_mapping_arguments(command)
    command.set_defaults(handler=_map)


def _run_mapping(args: argparse.Namespace) -> str | dict[str, Any] | None:
    """The mapping the flags say; --run-config NAME fills what they leave out: the run's `validate.mapping` and,
    without --data, its `retrain.data` (set on `args`). ConfigError for a run config that does not load."""
    from pipeline.config import ConfigError, load_params

    value = mapping_value(args)
    if args.run_config is not None:
        try:
            params = load_params(run_config=args.run_config)
        except ConfigError as error:
            raise ConfigError(f"--run-config {args.run_config}: {error}") from None
        args.data = args.data or params.retrain.data
        value = value if value is not None else params.validate.mapping
        if value is None:
            raise BadMappingFlags(f"--run-config {args.run_config} maps nothing (no validate.mapping: its data "
                                  f"{params.retrain.data} holds decision rows); give --mapping FILE or the flags")  # fmt: skip
    if args.data is None:
        raise BadMappingFlags("say which table: --data DATA, or --run-config NAME for the run's data")
    return value


def _as_trained(value: Any) -> Any:
    """A value the preview's JSON has no form for (a timestamp, a date), as the trained state's JSON writes it
    (orjson: `2024-01-01T12:00:00`)."""
    return orjson.loads(orjson.dumps(value, default=str))
