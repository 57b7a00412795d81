"""`decision feedback import`: labels for logged decisions from a file (what `decision review` writes, filled
in), checked as the API checks feedback and stored whole or not at all (docs/flywheel.md).

decision review --model decision-model --top 50 --out review.csv         # the least sure, to label
decision feedback import review.csv                                    # the labelled file back
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

from pipeline.cli.options import add_inference_flags, add_json_flag, inference_store
from pipeline.cli.runner import refuse, run_command

IMPORT_COMMAND = "feedback import"
DESCRIPTION = (
    "Store labels for logged decisions from FILE: JSONL of {decision_id, gold: {question: label}} or of "
    "{decision_id, question, label}, or a CSV with decision_id, question and label columns (what `decision "
    "review` writes; rows with no label are skipped). Checked as the API checks feedback; stored whole or "
    "not at all (exit 2 naming every problem)."
)


class NothingStored(ValueError):
    """The labelled file, or the store, refused: no label of the file is stored."""


@dataclass(frozen=True)
class ImportedFeedback:
    """The file, how many decisions it labels, and how many labels were stored."""

    file: str
    decisions: int
    stored: int

    def to_dict(self) -> dict:
        return asdict(self)


def add_feedback(commands) -> None:
    """`decision feedback` and its action `import` on the `decision` subparsers."""
    feedback = commands.add_parser(
        "feedback", help="outcomes for logged decisions (POST /v1/feedback, or a file)"
    )
    actions = feedback.add_subparsers(
        dest="action", required=True, metavar="ACTION", help="import: a labelled file"
    )
    importing = actions.add_parser(
        "import", help="store a labelled JSONL or CSV file", description=DESCRIPTION
    )
    importing.add_argument(
        "file", help="the labelled .jsonl or .csv file (a filled-in `decision review` file)"
    )
    add_inference_flags(importing)
    add_json_flag(importing)
    importing.set_defaults(handler=handle_feedback_import)


def handle_feedback_import(args: argparse.Namespace) -> int:
    from pipeline.config import ConfigError

    try:  # a bad --params or log folder is refused before the file is read, as `decision feedback: ...`
        where = inference_store(args)
    except ConfigError as error:
        return refuse(args, error)
    # What the import refuses names the action: `decision feedback import: ...`.
    importing = argparse.Namespace(**{**vars(args), "command": IMPORT_COMMAND})
    return run_command(
        importing,
        lambda: _imported(args.file, where),
        lambda imported: print(f"{imported.stored} labels for {imported.decisions} decisions stored"),
        refused_input=(NothingStored,),
    )


def _imported(file: str, where: str) -> ImportedFeedback:
    from pipeline.flywheel.feedback import (
        IMPORTER,
        FeedbackRefused,
        Labeller,
        located,
        parse_items,
        read_feedback_file,
        store_feedback,
    )
    from pipeline.flywheel.table import StoreUnavailable, open_store

    try:
        read = read_feedback_file(file)
        if not read:
            raise ValueError("no row has a label: fill in the label column (or gold), then import it")
        items = parse_items(read)
        stored = store_feedback(open_store(where), items, Labeller(None, admin=True), IMPORTER)
    except FeedbackRefused as error:
        raise NothingStored(f"nothing stored: {located(error, read)}") from None
    except StoreUnavailable as error:
        raise NothingStored(f"nothing stored: {error}") from None
    except (OSError, ValueError) as error:  # no such file, a line that is not JSON
        raise NothingStored(f"{file}: {error}") from None
    return ImportedFeedback(file=file, decisions=len(items), stored=stored)
