"""What several `decision` commands print with: rich's console, the held-out table (train, finetune) and the
certified-automation table (finetune, retrain); and
where their progress goes (stderr: tqdm bars on a terminal, lines otherwise, nothing with --quiet). A table
only one command prints lives in that command's module."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for annotations only: `decision --help` answers without torch
    from pipeline.training.fit import TrainRun


def say(line: str) -> None:
    """A progress line on stderr (stdout stays the command's result), written above a live tqdm bar."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


WIDE_OUTPUT = 200  # columns a table may use in a log or a pipe


def progress_outputs(args: argparse.Namespace) -> tuple[bool, Callable[[str], None] | None]:
    """(tqdm bars?, where progress lines go) for a long command: lines on stderr, bars only where stderr is a
    terminal (in a log file a bar is a smear of carriage returns; the lines say the same); nothing with
    --quiet. `--json` plays no part: it changes stdout only."""
    if args.quiet:
        return False, None
    return sys.stderr.isatty(), say


def console():
    """Rich's console: the terminal's width, or, where output goes to a file or a pipe (a log, `| tee`, CI),
    wide enough that no table is cut short with an ellipsis (rich would assume 80 columns there)."""
    from rich.console import Console

    plain = Console()
    return plain if plain.is_terminal or os.environ.get("COLUMNS") else Console(width=WIDE_OUTPUT)


def quiet_libraries(args: argparse.Namespace) -> None:
    """Where a command draws no bars (--quiet, or stderr is no terminal), Hugging Face libraries draw none
    either: their "Loading weights" and "Writing model shards" bars, and MLflow's "Downloading artifacts"."""
    if getattr(args, "quiet", False) or not sys.stderr.isatty():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        # Parsing may have imported it already (a --device imports torch, which brings it): tell it directly.
        if "transformers" in sys.modules:
            from transformers.utils import logging

            logging.disable_progress_bar()


def print_heldout(
    train: TrainRun, heldout: dict[str, Any], saved_to: str | None, calibrator: str = ""
) -> None:
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


def automation_table(certificates: dict[str, dict[str, Any]]):
    """Per question, the certified ε and threshold and what it automated of the held-out decisions: coverage
    and realised error with 95% intervals, or why nothing is automated (a rich Table)."""
    from rich.table import Table

    table = Table(title="Certified automation (held-out decisions)")
    table.add_column("question")
    for name in ("ε", "threshold", "coverage [95%]", "error [95%]"):
        table.add_column(name, justify="right")
    table.add_column("why none", overflow="fold")
    for question, c in sorted(certificates.items()):
        held = c.get("heldout") or {}
        certified = c.get("threshold") is not None
        table.add_row(
            question,
            f"{c['target_error']:g}",
            f"{c['threshold']:.4f}" if certified else "-",
            _with_interval(held, "coverage") if held else "-",
            _with_interval(held, "error") if held.get("error") is not None else "-",
            "" if certified else str(c.get("reason") or "not certified"),
        )
    return table


def _with_interval(figures: dict[str, Any], name: str) -> str:
    return f"{figures[name]:.3f} [{figures[f'{name}_low']:.3f}, {figures[f'{name}_high']:.3f}]"
