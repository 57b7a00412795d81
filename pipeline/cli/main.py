"""The `decision` command line: one subcommand per stage, each with `--help` and a `--json` mode; each command
is its own module (`pipeline/cli/<command>.py`: its flags, its checks, its printing), registered here.

    decision validate data/processed/vader.jsonl --slice 0:1000
    decision validate big.parquet --slice 1000000:1001000 --json

stdout carries the command's result (tables, or one JSON object with `--json`); progress goes to stderr, with
or without `--json`, and `--quiet` (-q) is what silences it. Heavy libraries are imported inside the
subcommands so that `decision --help` answers at once.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.cli.compare import add_compare
from pipeline.cli.evaluate import add_evaluate
from pipeline.cli.export import add_export
from pipeline.cli.families import add_families
from pipeline.cli.feedback import add_feedback
from pipeline.cli.finetune import add_finetune
from pipeline.cli.harvest import add_harvest
from pipeline.cli.init import add_init
from pipeline.cli.keygen import add_keygen
from pipeline.cli.map import add_map
from pipeline.cli.monitor import add_monitor
from pipeline.cli.options import show_defaults
from pipeline.cli.predict import add_predict
from pipeline.cli.promote import add_promote
from pipeline.cli.quantize import add_quantize
from pipeline.cli.register import add_register
from pipeline.cli.retrain import add_retrain
from pipeline.cli.review import add_review
from pipeline.cli.rollback import add_rollback
from pipeline.cli.runner import refuse
from pipeline.cli.serve import add_serve
from pipeline.cli.smoke import add_smoke
from pipeline.cli.snapshot import add_snapshot
from pipeline.cli.sweep import add_sweep
from pipeline.cli.tables import quiet_libraries
from pipeline.cli.train import add_train
from pipeline.cli.validate import add_validate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="decision",
        description="Fine-tune, calibrate, export, serve and promote decision models.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_validate(commands)
    add_train(commands)
    add_evaluate(commands)
    add_export(commands)
    add_quantize(commands)
    add_finetune(commands)
    add_families(commands)
    add_snapshot(commands)
    add_serve(commands)
    add_smoke(commands)
    add_keygen(commands)
    add_register(commands)
    add_promote(commands)
    add_rollback(commands)
    add_retrain(commands)
    add_init(commands)
    add_map(commands)
    add_predict(commands)
    add_compare(commands)
    add_sweep(commands)
    add_feedback(commands)
    add_review(commands)
    add_harvest(commands)
    add_monitor(commands)
    show_defaults(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_libraries(args)
    from pipeline.config import ConfigError  # after parsing, so that `--help` answers without pyarrow

    try:
        return args.handler(args)
    except ConfigError as error:  # a bad params.yaml, run config or flag value, from any subcommand
        return refuse(args, error)


if __name__ == "__main__":
    sys.exit(main())
