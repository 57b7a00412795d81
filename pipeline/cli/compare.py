"""`decision compare`: two models, the same rows, a paired bootstrap per question.

decision compare models:/decision-model@champion models:/decision-model/7 --data data/processed/vader.jsonl
decision compare runs/a/export runs/b/export --data data/processed/vader.jsonl --all-rows --json
"""

from __future__ import annotations

import argparse

from pipeline.cli.evaluate import error_text, print_automation
from pipeline.cli.options import SCORING_DEVICE_HELP, device_option
from pipeline.cli.runner import refuse, run_command
from pipeline.cli.tables import console, progress_outputs


def handle_compare(args: argparse.Namespace) -> int:
    from pipeline.data.read import UnreadableInput
    from pipeline.families.base import ModelLayoutError

    if not 0.5 <= args.confidence < 1:
        return refuse(args, f"--confidence must lie in [0.5, 1), got {args.confidence}")
    # ValueError: two models that share no decision, among others; all the user's input here.
    refused = (UnreadableInput, ModelLayoutError, ValueError)
    return run_command(args, lambda: _compared(args), print_comparison, refused_input=refused)


def _compared(args: argparse.Namespace):
    from pipeline.config import load_params
    from pipeline.stages.compare import compare_models

    _, say = progress_outputs(args)
    split = load_params(args.params).validate
    return compare_models(args.a, args.b, args.data, split, args.all_rows, args.confidence, args.device, say)


TABLE_COLUMNS = 180  # what the comparison table needs; a narrower terminal gets a line per question
COLUMNS = (
    "question",
    "decisions",
    "acc. A",
    "acc. B",
    "acc. gain",
    "NLL A",
    "NLL B",
    "NLL gain",
    "cov. A",
    "cov. B",
    "err. A",
    "err. B",
    "verdict",
)


def print_comparison(result) -> None:
    """One row per question (all first): each model's accuracy and NLL, B's gain with its interval, what each
    model's certificates automate (coverage, realised error), a verdict; in a terminal narrower than that
    table, the same as three lines per question (cut columns would hide the gains). Then each model's
    automation with 95% intervals."""
    from rich.table import Table

    out = console()
    level = f"{result.confidence:.0%}"
    a, b = (_shown(given, served) for given, served in zip((result.a, result.b), result.served_as))
    title = (
        f"A = {a}, B = {b}: {result.rows} rows of {result.data} ({result.records:,} records; "
        f"gains B over A, {level} paired record-bootstrap intervals)"
    )
    if out.width < TABLE_COLUMNS:
        out.print(title, highlight=False)
        for q in result.questions:
            out.print(f"{q.question} ({q.decisions:,} decisions): {q.verdict}", highlight=False)
            out.print(
                f"  accuracy {q.accuracy_a:.4f} -> {q.accuracy_b:.4f}, gain {_gain(q, 'accuracy')}; NLL "
                f"{q.nll_a:.4f} -> {q.nll_b:.4f}, gain {_gain(q, 'nll')}",
                highlight=False,
            )
            a_auto, b_auto = (_automated(result, side, q.question) for side in (0, 1))
            out.print(f"  automated: A {a_auto}; B {b_auto}", highlight=False)
        _print_automation(result, a, b)
        return
    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("question", "verdict") else "right")
    for q in result.questions:
        accuracy = (f"{q.accuracy_a:.4f}", f"{q.accuracy_b:.4f}", _gain(q, "accuracy"))
        nll = (f"{q.nll_a:.4f}", f"{q.nll_b:.4f}", _gain(q, "nll"))
        automated = (*_cells(result, 0, q.question), *_cells(result, 1, q.question))
        table.add_row(
            q.question, f"{q.decisions:,}", *accuracy, *nll, *automated[::2], *automated[1::2], q.verdict
        )
    out.print(table)
    _print_automation(result, a, b)


def _figures(result, side: int, question: str) -> dict | None:
    """One model's automation figures on a question (`all`: overall); None where not known."""
    if result.automation is None:
        return None
    automation = result.automation[side]
    if question == "all":
        return automation["overall"] | {"certified": automation["certified"]}
    return automation["by_question"].get(question)


def _cells(result, side: int, question: str) -> tuple[str, str]:
    """(coverage, realised error) of one model on a question: `not cert.` where it is not certified."""
    figures = _figures(result, side, question)
    if figures is None or not figures["certified"]:
        return "not cert.", "-"
    return f"{figures['coverage']:.3f}", "-" if figures["error"] is None else f"{figures['error']:.3f}"


def _automated(result, side: int, question: str) -> str:
    """`coverage 0.620, error 0.031 [0.018, 0.050]`, or `not certified`."""
    figures = _figures(result, side, question)
    if figures is None or not figures["certified"]:
        return "not certified"
    return f"coverage {figures['coverage']:.3f}, error {error_text(figures)}"


def _print_automation(result, a: str, b: str) -> None:
    if result.automation is not None:
        for name, automation in zip((f"A = {a}", f"B = {b}"), result.automation):
            print_automation(automation, f"certified automation of {name}")


def _gain(question, measure: str) -> str:
    gain, low, high = (getattr(question, f"{measure}_gain{end}") for end in ("", "_low", "_high"))
    return f"{gain:+.4f} [{low:+.4f}, {high:+.4f}]"


DESCRIPTION = (
    "Score A and B as served (their calibration applied) on the same decision rows of DATA and compare them "
    "decision by decision: for every question, and for all of them, each model's accuracy and NLL and B's "
    "gain over A with a paired record-bootstrap interval (a record's decisions resampled together; 2,000 "
    "draws), and a verdict (which is better beyond the noise, if either). The rows are DATA's held-out "
    "split under PARAMS' validate section (what a run on DATA reports on and the promotion gate compares "
    "on), or every usable row with --all-rows. Exit 2 for a model or DATA that cannot be read, or two "
    "models that share no decision."
)


def add_compare(commands) -> None:
    """`decision compare` on the `decision` subparsers."""
    compare = commands.add_parser(
        "compare",
        help="compare two models (export folders or registered versions) on the same rows, per question",
        description=DESCRIPTION,
    )
    compare.add_argument(
        "a", metavar="A", help="an export folder, models:/NAME@ALIAS or models:/NAME/VERSION"
    )
    compare.add_argument("b", metavar="B", help="the same kinds as A")
    compare.add_argument(
        "--data",
        required=True,
        help="decision rows with gold (any source decision validate reads: a file, a folder or glob of "
        "shards, a save_to_disk folder)",
    )
    compare.add_argument(
        "--all-rows", action="store_true", help="every usable row, not only the held-out split"
    )
    compare.add_argument("--params", default="params.yaml", help="where the held-out split is defined")
    compare.add_argument("--confidence", type=float, default=0.95, help="interval level (default 0.95)")
    compare.add_argument("--device", default="cpu", type=device_option, help=SCORING_DEVICE_HELP)
    compare.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    compare.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    compare.set_defaults(handler=handle_compare)


def _shown(given: str, served_as: str) -> str:
    """A model as given, with the version an alias points at now (`models:/x@champion (x/3)`)."""
    return f"{given} ({served_as})" if given.startswith("models:/") and served_as else given
