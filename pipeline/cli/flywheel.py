"""The `decision` subcommands of the flywheel (docs/flywheel.md): `feedback import` and `review` (`harvest` is
`pipeline.cli.harvest`).

decision review --model decision-model --top 50 --out review.csv         # the least sure, to label
decision feedback import review.csv                                    # the labelled file back
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.cli.tables import AT_LEAST_ONE, MISCOVERAGE

EXIT_OK, EXIT_REFUSED = 0, 2
INFERENCE_HELP = (
    "the inference log: a folder or postgresql:// URL (default: params.yaml's flywheel.inference)"
)


def _inference(args: argparse.Namespace) -> str:
    """The inference store to read: --inference, else params.yaml's; a folder that does not exist (a typo) is
    refused, exit 2, rather than read as a log with nothing in it."""
    from pipeline.config import load_params
    from pipeline.flywheel.table import missing_log

    where = args.inference or load_params(args.params).flywheel.inference
    if (problem := missing_log(where)) is not None:
        print(f"decision {args.command}: {problem}", file=sys.stderr)
        raise SystemExit(EXIT_REFUSED)
    return where


def _feedback_import(args: argparse.Namespace) -> int:
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

    where = _inference(args)  # a bad --params or log folder is refused before the file is read
    try:
        read = read_feedback_file(args.file)
        if not read:
            raise ValueError("no row has a label: fill in the label column (or gold), then import it")
        items = parse_items(read)
        stored = store_feedback(open_store(where), items, Labeller(None, admin=True), IMPORTER)
    except FeedbackRefused as error:
        print(
            f"decision feedback import: nothing stored: {located(error, read)}",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    except StoreUnavailable as error:
        print(f"decision feedback import: nothing stored: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except (OSError, ValueError) as error:  # no such file, a line that is not JSON
        print(f"decision feedback import: {args.file}: {error}", file=sys.stderr)
        return EXIT_REFUSED
    result = {"file": args.file, "decisions": len(items), "stored": stored}
    print(json.dumps(result) if args.json else f"{stored} labels for {len(items)} decisions stored")
    return EXIT_OK


def logged_model(text: str) -> str:
    """`--model`: NAME (every version) or NAME/VERSION, the version a number, as the inference log names them."""
    name, _, version = text.partition("/")
    if not name.strip() or (version and not version.isdigit()):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give NAME or NAME/VERSION (a version number), e.g. tickets/3"
        )
    return text


def _review(args: argparse.Namespace) -> int:
    from pipeline.families.base_folders import unwritable_place
    from pipeline.flywheel.review import UnknownModel, review_queue, write_queue
    from pipeline.flywheel.table import StoreUnavailable, open_store

    out = Path(args.out)
    # The log and the model first: a wrong one is the problem to name, whatever --out holds.
    try:
        items = review_queue(open_store(_inference(args)), args.model, args.top, args.order, args.alpha)
    except (StoreUnavailable, UnknownModel) as error:
        print(f"decision review: {error}", file=sys.stderr)
        return EXIT_REFUSED
    if (problem := _review_out_problem(out, args.overwrite) or unwritable_place(out)) is not None:
        print(f"decision review: --out {out}: {problem}", file=sys.stderr)
        return EXIT_REFUSED
    if not items:
        print(f"decision review: no unlabelled logged decisions of {args.model}", file=sys.stderr)
        if args.json:
            print(json.dumps({"model": args.model, "answers": 0, "out": None}))
        return EXIT_OK
    out = write_queue(items, out)
    no_sets = items[0].set_size is None
    order = "margin" if no_sets and args.order == "set_size" else args.order  # no sets to order by yet
    if args.json:
        print(json.dumps({"model": args.model, "answers": len(items), "out": str(out), "order": order,
                          "conformal_sets": not no_sets, "alpha": args.alpha}))  # fmt: skip
        return EXIT_OK
    sets = "no conformal sets (fewer than 30 labelled answers)" if no_sets else "conformal sets"
    print(f"{len(items)} answers to label in {out} (least sure first by {order}; {sets}); "
          f"label them, then: decision feedback import {out}")  # fmt: skip
    return EXIT_OK


def _review_out_problem(out: Path, overwrite: bool) -> str | None:
    """Why the queue must not be written to `out`: no .jsonl or .csv name, a folder, or a file already there
    (its labels, not imported yet, would be lost) without --overwrite."""
    if out.suffix.lower() not in (".jsonl", ".csv"):
        return "give a .jsonl or .csv file"
    if out.is_dir():
        return "a folder; give the file to write"
    if out.exists() and not overwrite:
        return (f"exists, and labels in it would be lost: import them first (decision feedback import {out}), "
                "then pass --overwrite, or give another file")  # fmt: skip
    return None


def add_flywheel_commands(commands) -> None:
    """Register feedback and review on the `decision` subparsers."""
    feedback = commands.add_parser(
        "feedback", help="outcomes for logged decisions (POST /v1/feedback, or a file)"
    )
    actions = feedback.add_subparsers(
        dest="action", required=True, metavar="ACTION", help="import: a labelled file"
    )
    importing = actions.add_parser(
        "import", help="store a labelled JSONL or CSV file",
        description="Store labels for logged decisions from FILE: JSONL of {decision_id, gold: {question: label}} "
                    "or of {decision_id, question, label}, or a CSV with decision_id, question and label columns "
                    "(what `decision review` writes; rows with no label are skipped). Checked as the API checks "
                    "feedback; stored whole or not at all (exit 2 naming every problem).",
    )  # fmt: skip
    importing.add_argument(
        "file", help="the labelled .jsonl or .csv file (a filled-in `decision review` file)"
    )
    importing.add_argument("--inference", metavar="DIR|URL", help=INFERENCE_HELP)
    importing.add_argument("--params", default="params.yaml", help="the params file")
    importing.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    importing.set_defaults(handler=_feedback_import)

    review = commands.add_parser(
        "review", help="the logged decisions a model was least sure of, as a file to label",
        description="List the answered questions of MODEL's logged decisions that have no feedback yet, least sure "
                    "first: margin (top probability minus the runner-up), entropy, and the size of a split-conformal "
                    "prediction set once 30 answers are labelled. Writes JSONL, or CSV for a .csv name.",
    )  # fmt: skip
    review.add_argument(
        "--model", required=True, type=logged_model, help="a model name (every version) or NAME/VERSION"
    )
    review.add_argument("--top", type=AT_LEAST_ONE, default=50, help="how many answers (default 50)")
    review.add_argument("--order", choices=["margin", "entropy", "set_size"], default="margin",
                        help="least sure first by the margin (top minus runner-up), the entropy, or the conformal set's size")  # fmt: skip
    review.add_argument(
        "--alpha", type=MISCOVERAGE, default=0.1, help="the conformal sets' miss rate (default 0.1)"
    )
    review.add_argument(
        "--out", default="review.jsonl", help="the file to write (.jsonl or .csv; default review.jsonl)"
    )
    review.add_argument("--overwrite", action="store_true", help="replace an --out that exists")
    review.add_argument("--inference", metavar="DIR|URL", help=INFERENCE_HELP)
    review.add_argument("--params", default="params.yaml", help="the params file")
    review.add_argument("--json", action="store_true",
                        help="print the outcome as one JSON object: answers written, the file, the order")  # fmt: skip
    review.set_defaults(handler=_review)
