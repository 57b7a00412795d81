"""`decision finetune`: the whole chain in one command, through the same stages as the retrain flow over a run
folder: validate, slice, split, train, calibrate and export.

decision finetune --data data/processed/vader.jsonl --base data/snapshots/minilm --out models/vader-minilm
decision finetune --data tickets.csv --mapping tickets.mapping.yaml --base BASE --out OUT --json
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from pipeline.cli.options import run_folder
from pipeline.cli.runner import run_command
from pipeline.cli.tables import automation_table, console, print_heldout
from pipeline.cli.training_flags import (
    add_training_arguments,
    run_exit_code,
    training_errors,
    training_inputs,
    warn_not_learned,
)

if TYPE_CHECKING:  # for annotations only: `decision --help` answers without torch
    from pipeline.stages.result import RunResult

DESCRIPTION = (
    "The whole chain, through the same stages as the retrain flow over a run folder: verify pins, validate "
    "DATA (--slice taken on the Arrow table) and split off held-out rows (or use --eval-data) once, train, "
    "calibrate on a validation split carved from the training rows (the held-out rows, cross-fitted, only "
    "where there is none; the calibration report, expected answers and plots stay in the run folder), and "
    "export the merged model to OUT."
)
NPROC_HELP = (
    "1 only: finetune trains in one process (decision train --nproc N, or the retrain flow with train.nproc, "
    "trains on N ranks)"
)


def add_finetune(commands) -> None:
    """`decision finetune` on the `decision` subparsers."""
    chain = commands.add_parser(
        "finetune",
        help="validate, slice, split, train, calibrate and export in one command",
        description=DESCRIPTION,
    )
    add_training_arguments(chain, out_help="the export folder", nproc_help=NPROC_HELP)
    chain.add_argument("--eval-data", help="use this file as the held-out set instead of splitting DATA")
    chain.add_argument(
        "--run-dir",
        type=run_folder,
        help="the run folder: split, fine-tune, held-out logits, calibration report, expected answers, plots "
        "(default: OUT.run beside the export; rewritten each run)",
    )
    chain.set_defaults(handler=handle_finetune)


def handle_finetune(args: argparse.Namespace) -> int:
    from pipeline.stages.finetune import finetune

    def finetuned() -> RunResult:
        given = training_inputs(args)
        with given.controls.cancel.on_signals():
            result = finetune(
                given.source,
                args.base,
                args.out,
                given.config,
                args.device,
                given.hooks,
                given.controls,
                args.run_dir,
                given.certify,
                given.quantize,
            )
        warn_not_learned(result.train.warnings)
        for notice in result.calibration.notices if result.calibration else []:
            print(f"note: {notice}", file=sys.stderr)
        return result

    return run_command(args, finetuned, print_finetuned, refused=training_errors(), done=run_exit_code)


def print_finetuned(result: RunResult) -> None:
    """The held-out table, the calibrator, and where the run's files are."""
    calibration = result.calibration
    fitted = (
        ""
        if calibration is None
        else (
            f"calibrator {calibration.calibrator['kind']}, fitted on the "
            f"{calibration.calibrator['fitted_on']}"
        )
    )
    print_heldout(result.train, result.heldout, result.export_dir, fitted)
    if calibration is not None and calibration.certificates:
        console().print(automation_table(calibration.certificates))
    temperatures = calibration.temperatures if calibration else "none (not calibrated)"
    print(
        f"family: {result.train.family} ({result.train.method}); temperatures: {temperatures}; "
        f"run folder (calibration report, plots, expected answers): {result.run_dir}"
    )
