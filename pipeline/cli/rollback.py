"""`decision rollback`: the champion alias moved back to the version it held before the latest promotion.

decision rollback
decision rollback --name tickets --json
"""

from __future__ import annotations

import argparse

from pipeline.cli.options import add_json_flag, add_model_name_flag
from pipeline.cli.promote import move_champion


def add_rollback(commands) -> None:
    """`decision rollback` on the `decision` subparsers."""
    back = commands.add_parser(
        "rollback",
        help="move the champion back one step",
        description="Point champion at the version it held before the latest promotion.",
    )
    add_model_name_flag(back)
    add_json_flag(back)
    back.set_defaults(handler=handle_rollback)


def handle_rollback(args: argparse.Namespace) -> int:
    from pipeline.mlops.promotion import rollback

    return move_champion(args, lambda: rollback(args.name), args.name)
