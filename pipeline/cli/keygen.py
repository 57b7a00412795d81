"""`decision keygen`: a new API key for an owner, printed once; only its sha256 is stored in the key file.

decision keygen --owner alice --keys keys.json
decision keygen --owner ops --keys keys.json --admin --json
"""

from __future__ import annotations

import argparse
import sys

from pipeline.cli.options import add_json_flag
from pipeline.cli.runner import EXIT_OK, run_command


def add_keygen(commands) -> None:
    """`decision keygen` on the `decision` subparsers."""
    keygen = commands.add_parser(
        "keygen",
        help="make an API key for an owner and store its hash",
        description="Print a new API key once and add its sha256 to the key file.",
    )
    keygen.add_argument(
        "--owner", required=True, help="whose key: the owner its requests, fine-tunes and feedback belong to"
    )
    keygen.add_argument("--keys", required=True, help="the key file (created if missing)")
    keygen.add_argument(
        "--admin",
        action="store_true",
        help="an admin key: may label any logged decision (POST /v1/feedback), not only its owner's",
    )
    add_json_flag(keygen)
    keygen.set_defaults(handler=handle_keygen)


def handle_keygen(args: argparse.Namespace) -> int:
    from pipeline.serving.keys import KeyConfigError, add_key

    return run_command(
        args,
        lambda: add_key(args.keys, args.owner, args.admin),
        print,
        refused_input=(KeyConfigError, OSError),
        as_json=lambda key: {"owner": args.owner, "key": key, "keys": args.keys},
        done=lambda key: _said_where(args.keys),
    )


def _said_where(keys: str) -> int:
    """Say, on stderr, that the key is shown this once (with --json too)."""
    print(f"(stored only as a hash in {keys}; this is the one time the key is shown)", file=sys.stderr)
    return EXIT_OK
