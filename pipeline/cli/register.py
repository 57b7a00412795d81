"""`decision register`: an export folder logged as an MLflow pyfunc model and registered as a new version (the
same export, for the same owner, is found rather than registered twice).

decision register --export models/vader-minilm
decision register --export models/tickets --name tickets --owner alice --json
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.cli.options import add_json_flag, add_model_name_flag
from pipeline.cli.retrain import OWNER_HELP
from pipeline.cli.runner import run_command


@dataclass(frozen=True)
class Registration:
    """The version an export is: `new` where this command registered it, not where it was found."""

    name: str
    version: str
    new: bool

    def to_dict(self) -> dict:
        return asdict(self)


def complete_export_argument(text: str) -> str:
    """`--export`: a folder some family wrote completely, checked before any MLflow run is made."""
    from pipeline.families import is_complete_export

    if not Path(text).is_dir():
        what = "a file" if Path(text).exists() else "no such folder"
        raise argparse.ArgumentTypeError(
            f"{text}: {what}; give the export folder (a run's export/, or decision finetune --out)"
        )
    if not is_complete_export(Path(text)):
        raise argparse.ArgumentTypeError(
            f"{text}: not a complete export (a folder `decision export` or `decision finetune` wrote); "
            "export the fine-tune first"
        )
    return text


def add_register(commands) -> None:
    """`decision register` on the `decision` subparsers."""
    register = commands.add_parser(
        "register",
        help="register an export folder as a new model version",
        description="Log EXPORT as an MLflow pyfunc model and register it; prints the version.",
    )
    register.add_argument(
        "--export",
        required=True,
        type=complete_export_argument,
        help="an export folder (decision export / finetune)",
    )
    add_model_name_flag(register)
    register.add_argument("--owner", help=OWNER_HELP)
    add_json_flag(register)
    register.set_defaults(handler=handle_register)


def handle_register(args: argparse.Namespace) -> int:
    from pipeline.families.base import ModelLayoutError

    # A version is what servers fetch: it must load, calibrator and weights, before it exists.
    return run_command(args, lambda: _registered(args), print_registration, refused_input=(ModelLayoutError,))


def _registered(args: argparse.Namespace) -> Registration:
    from pipeline.data.pins import current_md5, pin_tags
    from pipeline.families import load_decision_model
    from pipeline.families.exporting import read_manifest
    from pipeline.mlops.registry import find_version, register_export

    load_decision_model(args.export)
    # An ad-hoc export's manifest says which of its inputs DVC pinned: the version and its run say so too.
    pinned = pin_tags(read_manifest(args.export).get("inputs", {}))
    tags = {"registered_by": "decision register"} | pinned | ({"owner": args.owner} if args.owner else {})
    # The same bytes (for the same owner) are one version: a second register finds it, copies nothing.
    key = f"register:{current_md5(Path(args.export))}:{args.owner or ''}"
    known = find_version(args.name, key)
    version = known or register_export(args.export, args.name, tags=tags | {"idempotency_key": key})
    return Registration(name=args.name, version=version, new=known is None)


def print_registration(registration: Registration) -> None:
    """The name and version, and whether it was there already."""
    known = "" if registration.new else " (already registered: the same export)"
    print(f"{registration.name} version {registration.version}{known}")
