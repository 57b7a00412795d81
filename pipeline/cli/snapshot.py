"""`decision snapshot`: a base folder (or a Hugging Face Hub id, where online) made a pinned base: checked,
copied whole with one rename, and pinned with `dvc add`.

decision snapshot --from ~/models/deberta-v3-small --out data/snapshots/deberta
decision snapshot --from Qwen/Qwen3-0.6B --out data/snapshots/qwen3 --json
"""

from __future__ import annotations

import argparse

from pipeline.cli.options import add_json_flag, model_out
from pipeline.cli.runner import run_command

DESCRIPTION = (
    "Check that SOURCE loads as a base of some family (`decision families` says which), copy it whole into "
    "OUT with one rename (a Hub id is downloaded once, where the Hub is reachable; nothing is fetched at "
    "training time) and pin OUT with `dvc add` inside a DVC repository. Exit 2 when SOURCE is no base, or a "
    "Hub id while offline; OUT is then left as it was."
)


def add_snapshot(commands) -> None:
    """`decision snapshot` on the `decision` subparsers."""
    snapshot = commands.add_parser(
        "snapshot",
        help="make a base folder (or a Hugging Face Hub id, where online) a pinned base: checked, copied, "
        "dvc add",
        description=DESCRIPTION,
    )
    snapshot.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="SOURCE",
        help="a model folder (Hugging Face encoder or causal LM, Laya layout) or a Hub id",
    )
    snapshot.add_argument(
        "--out", required=True, type=model_out, help="the pinned copy, e.g. data/snapshots/NAME"
    )
    add_json_flag(snapshot)
    snapshot.set_defaults(handler=handle_snapshot)


def handle_snapshot(args: argparse.Namespace) -> int:
    from pipeline.stages.snapshot import PinFailed, snapshot_base

    return run_command(
        args,
        lambda: snapshot_base(args.source, args.out),
        print_pinned,
        refused=(PinFailed, OSError),  # a base that is none (BadBase) is the user's input: exit 2
        interrupted=f"interrupted; {args.out} and its pin are as they were",
    )


def print_pinned(pinned) -> None:
    """What the copy is, and what pins it."""
    print(f"{pinned.out}: {pinned.family} family, {pinned.base}")
    if pinned.md5 is not None:
        print(f"pinned by {pinned.pinned_by}: md5 {pinned.md5} (commit it; `dvc push` shares the bytes)")
    elif pinned.pinned_by is not None:
        print(f"a dvc.yaml stage's output: `{pinned.pinned_by}` pins it")
    else:
        print("outside a DVC repository: not pinned")
