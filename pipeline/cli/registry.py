"""The `decision` subcommands of the registry: `register`, `promote` and `rollback`.

decision promote 3                      # champion -> version 3 (refused if its smoke test failed or it
                                        # was trained with --allow-unpinned, unless --force)
decision rollback                       # champion back one step
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.cli.retrain import OWNER_HELP

EXIT_OK, EXIT_REFUSED, EXIT_BAD_INPUT = 0, 1, 2


def complete_export_argument(text: str) -> str:
    """`--export`: a folder some family wrote completely, checked before any MLflow run is made."""
    from pipeline.families import is_complete_export

    if not Path(text).is_dir():
        what = "a file" if Path(text).exists() else "no such folder"
        raise argparse.ArgumentTypeError(f"{text}: {what}; give the export folder (a run's export/, or "
                                         "decision finetune --out)")  # fmt: skip
    if not is_complete_export(Path(text)):
        raise argparse.ArgumentTypeError(f"{text}: not a complete export (a folder `decision export` or `decision "
                                         "finetune` wrote); export the fine-tune first")  # fmt: skip
    return text


def model_name(text: str) -> str:
    """`--name`: a model name every door takes (`registry_name_problem`)."""
    from pipeline.config import registry_name_problem

    if (problem := registry_name_problem(text)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _register(args: argparse.Namespace) -> int:
    from pipeline.data.pins import current_md5, pin_tags
    from pipeline.families import load_decision_model
    from pipeline.families.base import ModelLayoutError
    from pipeline.families.exporting import read_manifest
    from pipeline.mlops.registry import find_version, register_export

    try:  # a version is what servers fetch: it must load, calibrator and weights, before it exists
        load_decision_model(args.export)
    except ModelLayoutError as error:
        print(f"decision register: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT

    # An ad-hoc export's manifest says which of its inputs DVC pinned: the version and its run say so too.
    pinned = pin_tags(read_manifest(args.export).get("inputs", {}))
    tags = {"registered_by": "decision register"} | pinned | ({"owner": args.owner} if args.owner else {})
    # The same bytes (for the same owner) are one version: a second register finds it rather than copy it again.
    key = f"register:{current_md5(Path(args.export))}:{args.owner or ''}"
    known = find_version(args.name, key)
    version = known or register_export(args.export, args.name, tags=tags | {"idempotency_key": key})
    if args.json:
        print(json.dumps({"name": args.name, "version": version, "new": known is None}))
    else:
        print(f"{args.name} version {version}" + (" (already registered: the same export)" if known else ""))
    return EXIT_OK


def _promote(args: argparse.Namespace) -> int:
    from mlflow.exceptions import MlflowException

    from pipeline.mlops.promotion import CHAMPION, PromotionRefused, current, promote_version

    if _store_missing("promote"):
        return EXIT_BAD_INPUT
    try:
        before = current(args.name, CHAMPION)
        promote_version(args.name, args.version, args.force)
    except PromotionRefused as error:
        print(f"decision promote: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except MlflowException as error:  # no such model or version: the registry's own words, in one line
        print(f"decision promote: {args.name} version {args.version}: {error.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    _report(args, {"name": args.name, "champion": args.version, "previous": before})
    return EXIT_OK


def _rollback(args: argparse.Namespace) -> int:
    from mlflow.exceptions import MlflowException

    from pipeline.mlops.promotion import CHAMPION, PromotionRefused, current, rollback

    if _store_missing("rollback"):
        return EXIT_BAD_INPUT
    try:
        before = current(args.name, CHAMPION)
        now = rollback(args.name)
    except PromotionRefused as error:
        print(f"decision rollback: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except MlflowException as error:  # no such model: the registry's own words, in one line
        print(f"decision rollback: {args.name}: {error.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    _report(args, {"name": args.name, "champion": now, "previous": before})
    return EXIT_OK


def _store_missing(command: str) -> bool:
    """Say so where the default SQLite store does not exist here: MLflow would make an empty one and say "not
    found"."""
    from pipeline.mlops.registry import missing_store

    if (problem := missing_store()) is not None:
        print(f"decision {command}: {problem}", file=sys.stderr)
    return problem is not None


def _report(args: argparse.Namespace, result: dict) -> None:
    if args.json:
        print(json.dumps(result))
    else:
        if result["previous"] == result["champion"]:
            was = "already; nothing changed"
        else:
            was = "it had none" if result["previous"] is None else f"was {result['previous']}"
        print(f"{result['name']}: champion is version {result['champion']} ({was})")


def add_registry_commands(commands) -> None:
    """Register register, promote and rollback on the `decision` subparsers."""
    name_help = "registered model name (default: decision-model)"
    register = commands.add_parser("register", help="register an export folder as a new model version",
                                   description="Log EXPORT as an MLflow pyfunc model and register it; prints the version.")  # fmt: skip
    register.add_argument("--export", required=True, type=complete_export_argument,
                          help="an export folder (decision export / finetune)")  # fmt: skip
    register.add_argument("--name", default="decision-model", type=model_name, help=name_help)
    register.add_argument("--owner", help=OWNER_HELP)
    register.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    register.set_defaults(handler=_register)

    promote = commands.add_parser("promote", help="make a version the champion by hand",
                                  description="Point the champion alias at VERSION and record the move; a version "
                                  "whose smoke test did not pass, or trained with --allow-unpinned, is refused "
                                  "unless --force.")  # fmt: skip
    promote.add_argument("version", help="the version number to make the champion")
    promote.add_argument("--name", default="decision-model", type=model_name, help=name_help)
    promote.add_argument(
        "--force",
        action="store_true",
        help="promote even without a passed smoke test, or trained on unpinned inputs",
    )
    promote.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    promote.set_defaults(handler=_promote)

    back = commands.add_parser("rollback", help="move the champion back one step",
                               description="Point champion at the version it held before the latest promotion.")  # fmt: skip
    back.add_argument("--name", default="decision-model", type=model_name, help=name_help)
    back.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    back.set_defaults(handler=_rollback)
