"""`decision review`: the logged decisions a model was least sure of, as a file to label (then `decision
feedback import` it back; docs/flywheel.md). The answers the server automated that feedback says were wrong
come first.

decision review --model decision-model --top 50 --out review.csv
decision review --model tickets/3 --order set_size --alpha 0.1 --json
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.cli.options import (
    AT_LEAST_ONE,
    MISCOVERAGE,
    add_inference_flags,
    add_json_flag,
    inference_store,
)
from pipeline.cli.runner import EXIT_OK, refuse, run_command

DESCRIPTION = (
    "List the answered questions of MODEL's logged decisions that have no feedback yet, least sure first: "
    "margin (top probability minus the runner-up), entropy, and the size of a split-conformal prediction "
    "set once 30 answers are labelled. First, before them: the answers the server automated whose feedback "
    "says they were wrong (automated=true, with that feedback), to check. Writes JSONL, or CSV for a .csv "
    "name."
)


@dataclass(frozen=True)
class ReviewQueue:
    """The queue written: how many answers, where, in which order, with or without conformal sets (no file,
    and neither, where there was nothing to label)."""

    model: str
    answers: int
    out: str | None
    order: str | None = None
    conformal_sets: bool | None = None
    alpha: float | None = None
    automated_wrong: int = 0
    """Of the answers, those the server automated that feedback says were wrong (listed first)."""

    def to_dict(self) -> dict:
        written = asdict(self)
        return written if self.answers else {key: written[key] for key in ("model", "answers", "out")}


def logged_model(text: str) -> str:
    """`--model`: NAME (every version) or NAME/VERSION, the version a number, as the inference log names
    it."""
    name, _, version = text.partition("/")
    if not name.strip() or (version and not version.isdigit()):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give NAME or NAME/VERSION (a version number), e.g. tickets/3"
        )
    return text


def add_review(commands) -> None:
    """`decision review` on the `decision` subparsers."""
    review = commands.add_parser(
        "review",
        help="the logged decisions a model was least sure of, as a file to label",
        description=DESCRIPTION,
    )
    review.add_argument(
        "--model", required=True, type=logged_model, help="a model name (every version) or NAME/VERSION"
    )
    review.add_argument("--top", type=AT_LEAST_ONE, default=50, help="how many answers (default 50)")
    review.add_argument(
        "--order",
        choices=["margin", "entropy", "set_size"],
        default="margin",
        help="least sure first by the margin (top minus runner-up), the entropy, or the conformal set's size",
    )
    review.add_argument(
        "--alpha", type=MISCOVERAGE, default=0.1, help="the conformal sets' miss rate (default 0.1)"
    )
    review.add_argument(
        "--out", default="review.jsonl", help="the file to write (.jsonl or .csv; default review.jsonl)"
    )
    review.add_argument("--overwrite", action="store_true", help="replace an --out that exists")
    add_inference_flags(review)
    add_json_flag(review, help="print the outcome as one JSON object: answers written, the file, the order")
    review.set_defaults(handler=handle_review)


def handle_review(args: argparse.Namespace) -> int:
    from pipeline.flywheel.review import UnknownModel
    from pipeline.flywheel.table import StoreUnavailable

    return run_command(
        args,
        lambda: _reviewed(args),
        print_queue,
        refused_input=(StoreUnavailable, UnknownModel),
        done=lambda queue: _said_if_empty(args, queue),
    )


def _reviewed(args: argparse.Namespace) -> ReviewQueue:
    """The queue, written to --out; the log and the model are checked first (a wrong one is the problem to
    name, whatever --out holds), then --out (ConfigError)."""
    from pipeline.config import ConfigError
    from pipeline.families.base_folders import unwritable_place
    from pipeline.flywheel.review import review_queue, write_queue
    from pipeline.flywheel.table import open_store

    out = Path(args.out)
    items = review_queue(open_store(inference_store(args)), args.model, args.top, args.order, args.alpha)
    if (problem := _out_problem(out, args.overwrite) or unwritable_place(out)) is not None:
        raise ConfigError(f"--out {out}: {problem}")
    if not items:
        return ReviewQueue(model=args.model, answers=0, out=None)
    no_sets = items[0].set_size is None
    return ReviewQueue(
        model=args.model,
        answers=len(items),
        out=str(write_queue(items, out)),
        order="margin" if no_sets and args.order == "set_size" else args.order,  # no sets to order by yet
        conformal_sets=not no_sets,
        alpha=args.alpha,
        automated_wrong=sum(item.automated_wrong for item in items),
    )


def _out_problem(out: Path, overwrite: bool) -> str | None:
    """Why the queue must not be written to `out`: no .jsonl or .csv name, a folder, or a file already there
    (its labels, not imported yet, would be lost) without --overwrite."""
    if out.suffix.lower() not in (".jsonl", ".csv"):
        return "give a .jsonl or .csv file"
    if out.is_dir():
        return "a folder; give the file to write"
    if out.exists() and not overwrite:
        return (
            f"exists, and labels in it would be lost: import them first (decision feedback import {out}), "
            "then pass --overwrite, or give another file"
        )
    return None


def print_queue(queue: ReviewQueue) -> None:
    """Where the answers to label are, in which order, and the command that takes them back."""
    if not queue.answers:
        return  # said on stderr (`_said_if_empty`)
    sets = "conformal sets" if queue.conformal_sets else "no conformal sets (fewer than 30 labelled answers)"
    wrong = (
        f"first {queue.automated_wrong} automated but wrong by their feedback (check them), then "
        if queue.automated_wrong
        else ""
    )
    print(
        f"{queue.answers} answers to label in {queue.out} ({wrong}least sure first by {queue.order}; {sets}); "
        f"label them, then: decision feedback import {queue.out}"
    )


def _said_if_empty(args: argparse.Namespace, queue: ReviewQueue) -> int:
    """Nothing to label is no error (exit 0), but said on stderr, with --json too."""
    if not queue.answers:
        return refuse(args, f"no unlabelled logged decisions of {args.model}", EXIT_OK)
    return EXIT_OK
