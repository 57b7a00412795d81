"""`decision train`: fine-tune a base model on decision rows and report held-out metrics before and after.

decision train --data data/processed/vader.jsonl --base data/snapshots/minilm --out models/tuned
decision train --data tickets.csv --state-column text --label-column label --base BASE --out OUT --json
"""

from __future__ import annotations

import argparse

from pipeline.cli.runner import run_command
from pipeline.cli.tables import print_heldout
from pipeline.cli.training_flags import (
    add_training_arguments,
    run_exit_code,
    training_errors,
    training_inputs,
    warn_not_learned,
)

DESCRIPTION = (
    "Validate DATA, split off the held-out rows, fine-tune BASE in its model family (laya or joint) by its "
    "head on the frozen backbone (joint's default), LoRA, full fine-tuning or QLoRA, and save the fine-tune "
    "to OUT (laya LoRA: adapters plus head; otherwise a whole model). Settings come from params.yaml "
    "(train:); flags override them. Ctrl-C stops at the next step and saves nothing unless --save-on-cancel."
)


def add_train(commands) -> None:
    """`decision train` on the `decision` subparsers."""
    train = commands.add_parser(
        "train",
        help="fine-tune a base model on decision rows and report held-out metrics before and after",
        description=DESCRIPTION,
    )
    add_training_arguments(train, out_help="where to save the fine-tune")
    train.add_argument("--save-on-cancel", action="store_true", help="save what was trained when cancelled")
    train.set_defaults(handler=handle_train)


def handle_train(args: argparse.Namespace) -> int:
    from pipeline.stages.train import train_on_data

    def trained():
        given = training_inputs(args, save_on_cancel=args.save_on_cancel)
        with given.controls.cancel.on_signals():
            run = train_on_data(
                given.source, args.base, args.out, given.config, args.device, given.hooks, given.controls
            )
        warn_not_learned(run.warnings)
        return run

    return run_command(args, trained, print_trained, refused=training_errors(), done=run_exit_code)


def print_trained(run) -> None:
    """The held-out table before and after, the run's speed, and where the fine-tune went."""
    print_heldout(run, run.heldout, run.saved_to)
