"""`decision families`: the model families this installation has, their training methods (default first) and
the base folders they start from, read from the family interface itself.

decision families
decision families --json
"""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from pipeline.cli.options import add_json_flag
from pipeline.cli.runner import run_command


def add_families(commands) -> None:
    """`decision families` on the `decision` subparsers."""
    families = commands.add_parser(
        "families",
        help="the model families, their training methods (default first) and what base folders they start "
        "from",
        description="Every model family this installation has, from the family interface itself.",
    )
    add_json_flag(families)
    families.set_defaults(handler=handle_families)


def handle_families(args: argparse.Namespace) -> int:
    return run_command(args, described_families, print_families, as_json=dict)


def described_families() -> dict[str, dict[str, Any]]:
    """Each family by name: its methods, default method, the bases it starts from, its doc's opening."""
    from pipeline.families import FAMILIES

    return {
        name: {
            "methods": list(family.methods),
            "default_method": family.default_method,
            "bases": family.bases,
            "doc": " ".join((inspect.getdoc(family) or "").split("\n\n")[0].split()),
        }
        for name, family in FAMILIES.items()
    }


def print_families(described: dict[str, dict[str, Any]]) -> None:
    """A family per line, what it starts from under it, then the rule that picks one."""
    from pipeline.families import PICKING_RULE

    for name, entry in described.items():
        print(
            f"{name}: methods {', '.join(entry['methods'])} (default {entry['default_method']}); "
            f"{entry['doc']}"
        )
        print(f"  starts from: {entry['bases']}")
    print(f"rule: {PICKING_RULE}")
