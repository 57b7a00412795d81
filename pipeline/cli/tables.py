"""The tables the `decision` commands print on stdout (rich), one function per result; and where their progress
goes (stderr: tqdm bars on a terminal, lines otherwise, nothing with --quiet)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipeline.data.contract import GroupSizes, StateSizes

if TYPE_CHECKING:  # for annotations only: `decision --help` answers without torch
    from pipeline.stages.result import RunResult
    from pipeline.training.fit import TrainRun


def say(line: str) -> None:
    """A progress line on stderr (stdout stays the command's result), written above a live tqdm bar."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


SCORING_DEVICE_HELP = "cpu (default), cuda, cuda:1, ..., or auto (cuda where there is one)"


class DefaultsShown(argparse.HelpFormatter):
    """Help that says each option's default: `(default: X)` after a help text that does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        # by identity: a default of 0 is shown, though 0 == False
        nothing_to_show = (
            any(action.default is v for v in (None, False, argparse.SUPPRESS)) or not action.option_strings
        )
        if nothing_to_show or "default" in help_text or "%(default)" in help_text:
            return help_text
        return f"{help_text} (default: %(default)s)"


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Give `parser` and every subcommand's parser under it `DefaultsShown`."""
    parser.formatter_class = DefaultsShown
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                show_defaults(command)


def device_option(text: str) -> str:
    """`--device`: refused at once (exit 2) where it names no device this process can use, before a model loads."""
    from pipeline.device import device_problem

    problem = device_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def number_option(read: Callable[[str], float], accept: Callable[[float], bool],
                  expected: str) -> Callable[[str], float]:  # fmt: skip
    """An argparse type: the text as `read` takes it (int, float), refused at once (exit 2) saying what was
    `expected` where it is no number or `accept` fails (NaN fails every comparison)."""

    def option(text: str) -> float:
        try:
            value = read(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
        return value

    return option


WIDE_OUTPUT = 200  # columns a table may use in a log or a pipe
AT_LEAST_ONE = number_option(int, lambda n: n >= 1, "a whole number of at least 1, e.g. 50")
# A conformal set's miscoverage (evaluate --conformal, review --alpha).
MISCOVERAGE = number_option(float, lambda alpha: 0 < alpha < 1, "a miscoverage between 0 and 1, e.g. 0.1")


def progress_outputs(args: argparse.Namespace) -> tuple[bool, Callable[[str], None] | None]:
    """(tqdm bars?, where progress lines go) for a long command: lines on stderr, bars only where stderr is a
    terminal (in a log file a bar is a smear of carriage returns; the lines say the same); nothing with --quiet.
    `--json` plays no part: it changes stdout only."""
    if args.quiet:
        return False, None
    return sys.stderr.isatty(), say


def console():
    """Rich's console: the terminal's width, or, where output goes to a file or a pipe (a log, `| tee`, CI), wide
    enough that no table is cut short with an ellipsis (rich would assume 80 columns there)."""
    from rich.console import Console

    plain = Console()
    return plain if plain.is_terminal or os.environ.get("COLUMNS") else Console(width=WIDE_OUTPUT)


def quiet_libraries(args: argparse.Namespace) -> None:
    """Where a command draws no bars (--quiet, or stderr is no terminal), Hugging Face libraries draw none either:
    their "Loading weights" and "Writing model shards" bars, and MLflow's "Downloading artifacts"."""
    if getattr(args, "quiet", False) or not sys.stderr.isatty():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        # Parsing may have imported it already (a --device imports torch, which brings it): then tell it directly.
        if "transformers" in sys.modules:
            from transformers.utils import logging

            logging.disable_progress_bar()


def print_evaluation(report: dict[str, Any]) -> None:
    """`decision evaluate`: metrics per type, the calibration report, conformal sets and the plots written."""
    from rich.table import Table

    from pipeline.scoring.report import report_table

    model = report["model"]
    if model.startswith("models:/"):  # the version an alias points at now
        model = f"{model} ({report['served_as']})"
    table = Table(
        title=f"{model} on {report['data']} ({report['metrics']['overall']['decisions']:,} decisions)"
    )
    names = ("accuracy", "record_accuracy", "ece", "brier", "kl_soft", "score_mae")
    table.add_column("type")
    for name in names:
        table.add_column(name, justify="right")
    for kind, metrics in report["metrics"].items():
        table.add_row(kind, *(f"{metrics[n]:.4f}" for n in names))
    console().print(table)
    if report["calibration"]:
        print(
            "\ncalibration report (ECE-15 interval: 95% record bootstrap)\n"
            + report_table(report["calibration"])
        )
    if "conformal" in report:
        print_conformal(report["conformal"])
    print("plots: " + (", ".join(report["plots"]) or "none (use --plots DIR)"))


def print_conformal(conformal: dict) -> None:
    """Coverage and mean set size per type of split-conformal prediction sets."""
    print(f"\nsplit-conformal prediction sets, alpha {conformal['alpha']} (target coverage "
          f"{conformal['target_coverage']:.2f}; calibrated on one half of the records, measured on the other):")  # fmt: skip
    for name, figures in conformal["by_type"].items():
        print(f"  {name:7s} coverage {figures['coverage']:.4f}, mean set size {figures['mean_set_size']:.2f} "
              f"of {figures['mean_options']:.2f} options ({figures['decisions']} decisions)")  # fmt: skip


def print_heldout(train: TrainRun, heldout: dict[str, Any], saved_to: str | None, calibrator: str = "") -> None:
    """Before/after held-out metrics (`heldout`: base, tuned, and calibrated and a bag of words where the run
    went that far) and the training run's speed as a table; `calibrator` says what was fitted, on what."""
    from rich.table import Table

    table = Table(title=f"Held-out decisions: {heldout['decisions']:,}")
    table.add_column("model")
    for name in ("accuracy", "record_accuracy", "loss", "ece"):
        table.add_column(name, justify="right")
    for model in [k for k, v in heldout.items() if isinstance(v, dict)]:
        metrics = heldout[model]
        figures = (f"{metrics[k]:.4f}" for k in ("accuracy", "record_accuracy", "loss", "ece"))
        table.add_row(model.replace("_", " "), *figures)
    out = console()
    out.print(table)
    if calibrator:
        out.print(calibrator)
    state = "cancelled after" if train.cancelled else "trained"
    out.print(
        f"{state} {train.steps}/{train.planned_steps} steps in {train.train_seconds:.1f} s "
        f"({train.s_per_step:.2f} s/step, {train.decisions_per_second:.1f} decisions/s, {train.precision}); "
        f"skipped: {train.skipped or 'none'}"
    )
    out.print(f"saved to {saved_to}" if saved_to else "nothing saved")


def print_finetuned(result: RunResult) -> None:
    """`decision finetune`: the held-out table, the calibrator, and where the run's files are."""
    calibration = result.calibration
    fitted = "" if calibration is None else (
        f"calibrator {calibration.calibrator['kind']}, fitted on the {calibration.calibrator['fitted_on']}"
    )
    print_heldout(result.train, result.heldout, result.export_dir, fitted)
    temperatures = calibration.temperatures if calibration else "none (not calibrated)"
    print(
        f"family: {result.train.family} ({result.train.method}); temperatures: {temperatures}; "
        f"run folder (calibration report, plots, expected answers): {result.run_dir}"
    )


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
    if "states" in report:
        out.print(StateSizes(**report["states"]).describe(), highlight=False)
    if "groups" in report:
        out.print(
            GroupSizes(**report["groups"]).describe(report.get("states", {}).get("rows", report["rows"])),
            highlight=False,
        )
    for question, counts in report.get("labels", {}).items():  # a mapped table: its labels, as `decision map`
        shown = ", ".join(f"{label} {count:,}" for label, count in counts.items())
        out.print(f"labels of {question}: {shown}", highlight=False)
    if not report["skipped"]:
        out.print("No decision skipped.")
        return
    reasons = Table(title="Skipped decisions by reason (first example of each)")
    for name, justify in (("reason", "left"), ("count", "right"), ("row", "right"), ("question", "left"),
                          ("value", "left")):  # fmt: skip
        reasons.add_column(name, justify=justify, overflow="fold")
    for reason, count in report["skipped"].items():
        example = report["examples"][reason]
        reasons.add_row(reason, f"{count:,}", str(example["row"]), str(example["question_id"] or "-"),
                        example["value"][:80])  # fmt: skip
    out.print(reasons)
