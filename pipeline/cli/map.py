"""`decision map`: a plain table (a text column and a label column, say) read as decision rows: each
question's options with their counts, how many decisions are usable, and a preview (docs/data-format.md,
"Mapping a table").

    decision map --data tickets.csv --state-column text --label-column label --preview 3
    decision map --data tickets.parquet --mapping tickets.mapping.yaml --write tickets.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import orjson

from pipeline.cli.mapping_flags import BadMappingFlags, add_mapping_arguments, mapping_value
from pipeline.cli.options import add_json_flag, load_run_params, number_option
from pipeline.cli.runner import EXIT_OK, refuse, run_command

DESCRIPTION = (
    "Map DATA (a plain table: JSONL, Parquet or CSV) to decision rows with --mapping FILE or the flags, and "
    "print each question's options with their counts in the rows, how many decisions are usable (and why "
    "the rest are not), and the first rows as they will be trained; --write saves the mapped rows as a "
    "decision file. Exit 2 for a mapping that names a column DATA lacks, a label outside the given options, "
    "a DATA or slice that is the user's mistake, or rows with no usable decision; 1 when DATA cannot be "
    "read (corrupt, an I/O error)."
)
ROWS = number_option(int, lambda n: n >= 0, "a whole number of rows, 0 or more, e.g. 5")
_SUMMARY = ("decisions", "kept", "skipped_total", "skipped", "examples")


def add_map(commands) -> None:
    """`decision map` on the `decision` subparsers."""
    command = commands.add_parser(
        "map",
        help="read a plain table as decision rows: options per question with counts, and a preview",
        description=DESCRIPTION,
    )
    command.add_argument(
        "--data",
        help="the table: a file, folder or glob of shards, as training reads them (default: --run-config's "
        "retrain.data)",
    )
    command.add_argument(
        "--run-config",
        metavar="NAME",
        help="configs/NAME.yaml (as decision init writes it): its validate.mapping where neither --mapping "
        "nor the flags are given, and its retrain.data where --data is not",
    )
    command.add_argument("--preview", type=ROWS, default=5, metavar="N", help="rows to print (default: 5)")
    command.add_argument("--write", metavar="OUT", help="write the mapped rows to OUT (.jsonl or .parquet)")
    command.add_argument("--slice", metavar="START:END", help="map rows [START, END) only")
    add_json_flag(command)
    add_mapping_arguments(command)
    command.set_defaults(handler=handle_map)


def handle_map(args: argparse.Namespace) -> int:
    from pipeline.data.read import UnreadableInput

    return run_command(
        args,
        lambda: _mapped(args),
        lambda result: print(_text(result)),
        refused=(UnreadableInput,),
        refused_input=(BadMappingFlags,),
        as_json=dict,
        done=lambda result: _usable(args, result["validation"]),
    )


def _mapped(args: argparse.Namespace) -> dict[str, Any]:
    """What `decision map` prints (`_result`), the rows written where --write says and any is usable."""
    from pipeline.data.mapping import load_mapping, read_mapped, write_rows
    from pipeline.data.read import RowSlice
    from pipeline.data.validate import validate_columns

    value = _run_mapping(args)
    if value is None:
        raise BadMappingFlags("say how to map DATA: --mapping FILE, or --state-column COL --label-column COL")
    mapping, row_slice = load_mapping(value), RowSlice.parse(args.slice)
    if args.write and (problem := _write_problem(Path(args.write), args.data)):
        raise BadMappingFlags(problem)
    mapped, total = read_mapped(args.data, mapping, row_slice)
    report = validate_columns(mapped.columns, row_slice.start, with_records=False).report.to_dict()
    # Nothing is written from rows with no usable decision.
    replaced = bool(args.write) and Path(args.write).exists()
    written = write_rows(mapped, args.write) if args.write and report["kept"] else None
    return _result(args, mapping, mapped, total, report, written) | {"replaced": bool(written) and replaced}


def _usable(args: argparse.Namespace, summary: dict[str, Any]) -> int:
    """Exit 2 where no decision is usable: nothing was written then."""
    if summary["kept"] == 0:
        return refuse(
            args,
            f"no usable decision in {args.data} ({summary['decisions']} decisions, all skipped: "
            f"{_reasons(summary['skipped'])}); nothing written",
        )
    return EXIT_OK


def _run_mapping(args: argparse.Namespace) -> str | dict[str, Any] | None:
    """The mapping the flags say; --run-config NAME fills what they leave out: the run's `validate.mapping`
    and, without --data, its `retrain.data` (set on `args`). ConfigError for a run config that won't load."""
    value = mapping_value(args)
    if args.run_config is not None:
        params = load_run_params(args.run_config)
        args.data = args.data or params.retrain.data
        value = value if value is not None else params.validate.mapping
        if value is None:
            raise BadMappingFlags(
                f"--run-config {args.run_config} maps nothing (no validate.mapping: its data "
                f"{params.retrain.data} holds decision rows); give --mapping FILE or the flags"
            )
    if args.data is None:
        raise BadMappingFlags("say which table: --data DATA, or --run-config NAME for the run's data")
    return value


def _write_problem(out: Path, data: str) -> str | None:
    """Why mapped rows must not go to `out`: it is the table being mapped, lies in the folder of its shards,
    is a folder, or lies where no file can be made."""
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
    """What `decision map` prints: per question its column, type and option counts; validation; a preview."""
    from pipeline.data.mapping import decision_rows, option_counts

    counts = option_counts(mapped)
    questions = {
        qid: {
            "column": q.column,
            "type": q.type,
            "instructions": q.instructions,
            "options_given": mapping.questions[qid].options is not None,
            "options": counts[qid],
        }
        for qid, q in mapped.mapping.questions.items()
    }
    return {
        "source": args.data,
        "slice": args.slice or "0:",
        "file_rows": total,
        "rows": len(mapped.columns),
        "questions": questions,
        "validation": {k: report[k] for k in _SUMMARY},
        "preview": decision_rows(mapped, args.preview),
        "written": str(written) if written else None,
    }


def _text(result: dict[str, Any]) -> str:
    sliced = "" if result["slice"] == "0:" else f" (rows {result['slice']} of {result['file_rows']:,})"
    lines = [f"{result['source']}: {result['rows']:,} rows{sliced}"]
    for qid, question in result["questions"].items():
        lines += _question_lines(qid, question)
    summary = result["validation"]
    skipped = f": {_reasons(summary['skipped'])}" if summary["skipped"] else ""
    lines.append(f"{summary['kept']:,} of {summary['decisions']:,} decisions usable{skipped}")
    lines.append(f"the first {len(result['preview'])} rows as they will be trained:")
    lines += [json.dumps(row, default=_as_trained) for row in result["preview"]]
    if result["written"]:
        replaced = " (replacing the file that was there)" if result.get("replaced") else ""
        lines.append(f"wrote {result['rows']:,} decision rows to {result['written']}{replaced}")
    return "\n".join(lines)


def _question_lines(qid: str, question: dict[str, Any]) -> list[str]:
    """A question's label column and type, then each option with its count."""
    origin = "given" if question["options_given"] else "from the labels"
    origin = "false/true" if question["type"] == "noul" else origin
    width = max(len(option) for option in question["options"])
    return [
        f"question {qid} ({question['type']}, labels in column {question['column']}): options {origin}, with "
        "their counts",
        *(f"  {option:{width}s}  {count:,}" for option, count in question["options"].items()),
    ]


def _reasons(skipped: dict[str, int]) -> str:
    return ", ".join(f"{reason} {count:,}" for reason, count in skipped.items())


def _as_trained(value: Any) -> Any:
    """A value the preview's JSON has no form for (a timestamp, a date), as the trained state's JSON writes it
    (orjson: `2024-01-01T12:00:00`)."""
    return orjson.loads(orjson.dumps(value, default=str))
