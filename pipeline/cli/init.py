"""`decision init`: a user's data and base as the pinned inputs of a named run (`make run DATA=...` calls it).

decision init --data ~/exports/tickets.csv                 # configs/tickets.yaml; data copied in and pinned
decision init --data data/shards/ --base ~/models/deberta --name support
"""

from __future__ import annotations

import argparse
import sys

from pipeline.cli.mapping_flags import BadMappingFlags, add_mapping_arguments, mapping_value
from pipeline.cli.options import add_json_flag
from pipeline.cli.retrain import retrain
from pipeline.cli.runner import EXIT_OK, run_command
from pipeline.cli.tables import say

DESCRIPTION = (
    "Make DATA (and BASE) the pinned inputs of the run NAME: DATA is pinned with `dvc add` (copied into "
    "data/own/ first when it lies outside the project), BASE is pinned as it is when it lies inside the "
    "project, else snapshotted into data/snapshots/ (`decision snapshot --from`), and configs/NAME.yaml "
    "names them, the run folder runs/NAME/, the registered model NAME and the mapping of a plain table "
    "(keys you add to it are kept). A rerun re-pins: changed data is a new revision, and it says so. Exit 2 "
    "on a bad name, a source or mapping that cannot be read, a base that is no model, or a "
    "configs/NAME.yaml that init did not write (a shipped or hand-written config is never taken over) or "
    "that would not load; nothing is pinned or written then."
)


def add_init(commands) -> None:
    """`decision init` on the `decision` subparsers."""
    init = commands.add_parser(
        "init",
        help="pin your data and base and write the run config that `make run NAME=...` trains",
        description=DESCRIPTION,
    )
    init.add_argument(
        "--data",
        required=True,
        help="a decision or table file, a folder or glob of shards, a save_to_disk folder, or hf:OWNER/NAME "
        "(docs/data-format.md, Sources)",
    )
    init.add_argument("--base", help="a model folder or Hub id (default: the stock MiniLM snapshot)")
    init.add_argument("--name", help="the run and model name (default: DATA's file or folder name)")
    add_json_flag(init)
    init.add_argument(
        "--run",
        action="store_true",
        help="then run the retrain flow on it (what `make run DATA=...` does): its exit code is the "
        "command's",
    )
    add_mapping_arguments(init)
    init.set_defaults(handler=handle_init)


def handle_init(args: argparse.Namespace) -> int:
    from pipeline.data.read import UnreadableInput
    from pipeline.stages.init import BadInit, init_run
    from pipeline.stages.snapshot import PinFailed

    return run_command(
        args,
        lambda: init_run(args.data, args.base, args.name, mapping_value(args), report=say),
        lambda result: print_init(result, args.run),
        refused_input=(BadInit, PinFailed, BadMappingFlags, UnreadableInput),
        done=lambda result: _then_retrain(args, result),
    )


def _then_retrain(args: argparse.Namespace, result) -> int:
    """With --run, what `make run DATA=...` does next: the retrain flow on this run, its exit code."""
    if not args.run:
        return EXIT_OK
    sys.stdout.flush()  # what init said, before the flow's own lines
    return retrain(args, {"run_config": result.name})


def print_init(result, then_run: bool) -> None:
    """What was pinned and written, and the next command (or that the run is training now)."""
    if result.previous_data_md5 == result.data_md5:
        revision = "unchanged"
    else:
        first = "pinned for the first time"
        revision = f"a new revision (was {result.previous_data_md5})" if result.data_changed else first
    copied = " (copied in: DVC pins only what lies inside the project)" if result.copied else ""
    print(f"data  {result.data}{copied}: md5 {result.data_md5}, {revision}")
    print(f"base  {result.base}: md5 {result.base_md5 or 'built by `dvc repro snapshot`'}")
    done = "updated" if result.updated else "wrote"
    kept = " (its other keys kept)" if result.updated else ""
    print(
        f"{done} {result.run_config}: the run's data, base, runs/{result.name}/ and model name "
        f"{result.name}{kept}"
    )
    if result.mapping_dropped:
        print(f"removed validate.mapping from {result.run_config}: {result.data} holds decision rows")
    if result.ledger:
        print(f"held out {result.heldout} rows, listed in {result.ledger} (never trained on)")
    if result.to_commit:
        print(f"commit them (DVC keeps the bytes): git add {' '.join(result.to_commit)}")
    if then_run:
        print(
            f"training it: decision retrain --run-config {result.name} (serve it after with make serve "
            f"NAME={result.name})"
        )
        return
    print(
        f"next: decision retrain --run-config {result.name}   (or make run NAME={result.name}),\n"
        f"      then make serve NAME={result.name}"
    )
