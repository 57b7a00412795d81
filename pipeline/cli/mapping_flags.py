"""The mapping flags of the commands that read a plain table (`map`, `validate`, `train`, `finetune`,
`evaluate`, `predict`, `init`): `--mapping FILE`, or the flags of the common case (a text column and a label
column, say), and the mapping they stand for (docs/data-format.md, "Mapping a table").

    decision validate tickets.csv --state-column text --label-column label
    decision validate tickets.csv --mapping tickets.mapping.yaml
"""

from __future__ import annotations

import argparse
from typing import Any

_QUESTION_FLAGS = ("question", "type", "instructions", "options")


class BadMappingFlags(ValueError):
    """Mapping flags that do not make a mapping (the message names the flag)."""


def add_mapping_arguments(command: argparse.ArgumentParser) -> None:
    """`--mapping FILE`, or the flags of the common case, on a command that reads a table."""
    group = command.add_argument_group(
        'mapping a plain table (docs/data-format.md, "Mapping a table"): --mapping FILE, or --state-column '
        "with --label-column"
    )
    group.add_argument(
        "--mapping",
        metavar="FILE",
        help="a mapping YAML file: state column(s), and per question its label column, type, instructions "
        "and options (default: validate.mapping in params.yaml where the command reads it; else DATA "
        "holds decision rows)",
    )
    group.add_argument(
        "--state-column",
        nargs="+",
        metavar="COL",
        help="the state's column; several make a JSON-object state {COL: value}",
    )
    group.add_argument("--label-column", metavar="COL", help="the column holding the question's gold labels")
    group.add_argument(
        "--question", metavar="ID", help="the question's id (default: the label column's name)"
    )
    group.add_argument(
        "--type",
        choices=("choice", "score", "noul"),
        help="choice (default), score (ordered levels) or noul (yes/no: true/false, yes/no, 1/0)",
    )
    group.add_argument("--instructions", metavar="TEXT", help="what the question asks")
    group.add_argument(
        "--options",
        nargs="+",
        metavar="LABEL",
        help="the labels allowed, in order (a score's levels low to high; default: the labels found); a "
        "label outside them is refused",
    )


def mapping_value(args: argparse.Namespace) -> str | dict[str, Any] | None:
    """What the flags say `validate.mapping` is: the --mapping path, the mapping the flags make, or None."""
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
    return flags_mapping(
        args.state_column,
        args.label_column,
        args.question,
        args.type or "choice",
        args.instructions,
        args.options,
    )


def loaded_mapping(value: str | dict[str, Any] | None):
    """The mapping `value` (a `mapping_value`) stands for, loaded and checked (MappingError), or None."""
    from pipeline.data.mapping import load_mapping

    return load_mapping(value) if value is not None else None


def _flag(args: argparse.Namespace, flag: str) -> Any:
    return getattr(args, flag.removeprefix("--").replace("-", "_"))
